"""The watchdog's bookkeeping of beats, fed datagrams directly (no processes)."""

from __future__ import annotations

import os

from ckpt_tool.supervise.events import read_events
from ckpt_tool.supervise.watchdog import RunConfig, Watchdog


def beat(rank, step, phase, attempt=0, ckpt=None, pid=None):
    return {"rank": rank, "pid": pid or os.getpid(), "step": step, "phase": phase, "attempt": attempt, "ckpt": ckpt, "addr": ""}


def test_resumed_is_logged_after_a_requeue_and_after_a_restart(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 0, "init"), 1.0)
    w._handle(beat(0, 40, "step", ckpt=40), 2.0)  # a requeued job: attempt 0, resumed from 40
    w._handle(beat(0, 41, "step", ckpt=40), 2.1)
    w._handle(beat(0, 0, "init", attempt=1), 5.0)  # torchrun restarted the group
    w._handle(beat(0, 40, "step", attempt=1, ckpt=40), 6.0)
    events = [(e["event"], e.get("step")) for e in read_events(tmp_path)]
    assert events == [("resumed", 40), ("failure_counted", None), ("restarted", None), ("resumed", 40)]


def test_a_fresh_start_is_not_a_resume_and_garbage_is_ignored(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 1, "step"), 1.0)
    w._handle({"rank": "x"}, 1.0)
    w._handle({"rank": 0, "pid": 1, "step": "nan?", "phase": "step"}, 1.0)
    assert read_events(tmp_path) == []
    assert w.beats[0].step == 1
