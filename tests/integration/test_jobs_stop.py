"""`ckpt run` stopped by TERM (what `scancel` sends) checkpoints and exits 75 without claiming a
requeue in its events: the batch script decides that and records it."""

from __future__ import annotations

import os
import signal

import pytest

from ckpt_tool.errors import ExitCode


@pytest.mark.slow
def test_a_term_stop_does_not_claim_a_requeue(supervised):
    s = supervised().start()
    s.wait_for_step(6)
    os.kill(s.proc.pid, signal.SIGTERM)
    assert s.wait() == ExitCode.REQUEUE, s.log_tail()
    events = {e["event"]: e for e in s.events()}
    asked, stopped = events["stop_requested"], events["stopped_for_requeue"]
    assert asked["purpose"] == "stop" and asked["signals"] == ["TERM"] and "for requeue" not in asked["note"], asked
    assert "scancel" in asked["note"] and "the batch script requeues only" in asked["note"]
    assert stopped["purpose"] == "stop" and "for requeue" not in stopped["note"] and "batch script's decision" in stopped["note"], stopped
