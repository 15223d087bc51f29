"""The watchdog's bookkeeping of beats, fed datagrams directly (no processes)."""

from __future__ import annotations

import os

from ckpt_tool.supervise.events import read_events
from ckpt_tool.supervise.watchdog import RunConfig, Watchdog


def beat(rank, step, phase, attempt=0, ckpt=None, pid=None, resumed_from=None):
    return {
        "rank": rank,
        "pid": pid or os.getpid(),
        "step": step,
        "phase": phase,
        "attempt": attempt,
        "ckpt": ckpt,
        "resumed_from": resumed_from,
        "addr": "",
    }


def test_resumed_is_logged_after_a_requeue_and_after_a_restart(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 0, "init"), 1.0)
    w._handle(beat(0, 40, "step", ckpt=40, resumed_from=40), 2.0)  # a requeued job: attempt 0, resumed from 40
    w._handle(beat(0, 41, "step", ckpt=40, resumed_from=40), 2.1)
    w._handle(beat(0, 0, "init", attempt=1), 5.0)  # torchrun restarted the group
    w._handle(beat(0, 40, "step", attempt=1, ckpt=40, resumed_from=40), 6.0)
    events = [(e["event"], e.get("step")) for e in read_events(tmp_path)]
    assert events == [("resumed", 40), ("failure_counted", None), ("restarted", None), ("resumed", 40)]


def test_a_fresh_start_is_not_a_resume_even_after_its_first_save(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 1, "step"), 1.0)
    w._handle(beat(0, 5, "checkpoint"), 1.5)
    w._handle(beat(0, 5, "step", ckpt=5), 2.0)  # its first checkpoint is committed: still not a resume
    w._handle(beat(0, 6, "step", ckpt=5), 2.1)
    assert [e["event"] for e in read_events(tmp_path)] == []


def test_a_fatal_report_is_kept_only_for_errors_a_restart_cannot_fix(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle({"rank": 1, "pid": 1, "event": "fatal", "exit_code": 1, "message": "a crash"}, 1.0)
    assert w.fatal is None
    w._handle({"rank": 1, "pid": 1, "event": "fatal", "exit_code": 4, "message": "does not fit"}, 1.0)
    assert w.fatal == {"rank": 1, "exit_code": 4, "message": "does not fit"}


def test_garbage_is_ignored(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 1, "step"), 1.0)
    w._handle({"rank": "x"}, 1.0)
    w._handle({"rank": 0, "pid": 1, "step": "nan?", "phase": "step"}, 1.0)
    assert read_events(tmp_path) == []
    assert w.beats[0].step == 1
