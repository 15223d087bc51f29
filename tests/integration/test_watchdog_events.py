"""The watchdog's bookkeeping of beats, fed datagrams directly (no processes)."""

from __future__ import annotations

import os
import subprocess

from ckpt_tool.supervise.run_dir import read_events
from ckpt_tool.supervise.watchdog import RunConfig, Watchdog

NEW_PID = 2**22 + 1  # a restarted rank is a new process


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
    w._handle(beat(0, 0, "init", attempt=1, pid=NEW_PID), 5.0)  # torchrun restarted the group: new processes
    w._handle(beat(0, 40, "step", attempt=1, ckpt=40, resumed_from=40, pid=NEW_PID), 6.0)
    events = [(e["event"], e.get("step")) for e in read_events(tmp_path)]
    assert events == [
        ("ranks_started", None),  # the first beat of each attempt's ranks on this node
        ("resumed", 40),
        ("failure_counted", None),
        ("restarted", None),
        ("ranks_started", None),
        ("resumed", 40),
    ]


def test_a_beat_from_a_rank_of_the_previous_attempt_is_not_taken_for_the_new_ones(tmp_path):
    """A survivor of a failed attempt beats until it is gone (its heartbeat is a thread); once the
    restarted group beats, its late beat must not become the new attempt's rank 0 (its death
    would then fail the new attempt) nor feed the new attempt's straggler scores."""
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 12, "step"), 1.0)
    w._handle(beat(0, 11, "step", attempt=1, pid=NEW_PID), 5.0)  # torchrun restarted the group
    w._handle(beat(0, 12, "step"), 5.1)  # the old rank 0, still dying
    assert w.beats[0].pid == NEW_PID and w.attempt_pids == {NEW_PID} and w.beats[0].step == 11


def test_a_fresh_start_is_not_a_resume_even_after_its_first_save(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 1, "step"), 1.0)
    w._handle(beat(0, 5, "checkpoint"), 1.5)
    w._handle(beat(0, 5, "step", ckpt=5), 2.0)  # its first checkpoint is committed: still not a resume
    w._handle(beat(0, 6, "step", ckpt=5), 2.1)
    assert [e["event"] for e in read_events(tmp_path)] == ["ranks_started"]  # no "resumed"


def test_a_fatal_report_is_kept_only_for_errors_a_restart_cannot_fix(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle({"rank": 1, "pid": 1, "event": "fatal", "exit_code": 1, "message": "a crash"}, 1.0)
    assert w.reports.fatal is None
    w._handle({"rank": 1, "pid": 1, "event": "fatal", "exit_code": 4, "message": "does not fit"}, 1.0)
    assert w.reports.fatal == {"rank": 1, "exit_code": 4, "message": "does not fit"}


def test_garbage_is_ignored(tmp_path):
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path), report=lambda line: None)
    w._handle(beat(0, 1, "step"), 1.0)
    w._handle({"rank": "x"}, 1.0)
    w._handle({"rank": 0, "pid": 1, "step": "nan?", "phase": "step"}, 1.0)
    assert [e["event"] for e in read_events(tmp_path)] == ["ranks_started"]  # the valid beat only
    assert w.beats[0].step == 1


def test_a_restart_caused_by_another_node_is_a_new_attempt_though_torchrun_keeps_its_count(tmp_path):
    """An agent that restarts its ranks because another node failed does not raise its restart
    count (measured on the 3-node cluster): the watchdog knows the new attempt by its new
    processes. Before, their beats were dropped as stragglers of the closed attempt."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path, node="n1", round_id="j.0.0"), report=lambda line: None)
    w._handle(beat(0, 5, "step", pid=dead.pid), 1.0)
    peer_error = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:50379"
    w._handle({"rank": 0, "pid": dead.pid, "event": "crashed", "error": "builtins.RuntimeError", "message": peer_error}, 1.1)
    w._check_deaths()
    w._handle(beat(0, 0, "init", attempt=0, pid=NEW_PID), 5.0)
    w._handle(beat(0, 6, "step", attempt=0, pid=NEW_PID), 6.0)
    events = read_events(tmp_path)
    [exited] = [e for e in events if e["event"] == "rank_exited"]
    assert (exited["cause"], exited["node"], exited["round"], exited["attempt"]) == ("peer_failure", "n1", "j.0.0", 0)
    assert [e["attempt"] for e in events if e["event"] == "restarted"] == [1]
    assert w.attempt == 1 and w.beats[0].step == 6  # the new ranks are watched


def test_ranks_that_stopped_for_another_nodes_round_end_end_this_node_with_77_not_finished(tmp_path):
    """Node b's watchdog ended the round after a checkpoint (a suspect node while training); the
    stop reached this node's ranks through the job's step sync before this watchdog read b's
    marker: the ranks exit 0, and this node must still end the round (77), not report "finished"."""
    from ckpt_tool.errors import ExitCode
    from ckpt_tool.supervise import round_end

    cfg = RunConfig(command=("x",), run_dir=tmp_path, node="a", round_id="r1")
    w = Watchdog(cfg, report=lambda line: None)
    w._handle(beat(0, 14, "step"), 1.0)
    w._handle({"rank": 0, "pid": os.getpid(), "event": "stopped", "step": 14}, 1.1)  # not asked by this watchdog
    round_end.end_round(tmp_path, "r1", ["b"], "b", checkpoint_first=True)
    assert w._finished(0) == ExitCode.NODE_FAULT
    [ended] = [e for e in read_events(tmp_path) if e["event"] == "round_ended"]
    assert ended["suspects"] == ["b"] and ended["step"] == 14

    late = Watchdog(RunConfig(command=("x",), run_dir=tmp_path, node="a", round_id="r1"), report=lambda line: None)
    late._handle(beat(0, 14, "step"), 1.0)
    late._handle({"rank": 0, "pid": os.getpid(), "event": "stopped", "step": 14}, 1.1)
    late._round_end(round_end.round_ended(tmp_path, "r1"))  # the marker read after the ranks stopped, before torchrun exited
    assert late._finished(0) == ExitCode.NODE_FAULT

    gone = Watchdog(RunConfig(command=("x",), run_dir=tmp_path, node="a", round_id="r1"), report=lambda line: None)
    gone._handle(beat(0, 14, "step"), 1.0)
    gone._handle({"rank": 0, "pid": os.getpid(), "event": "stopped", "step": 14}, 1.1)
    gone.beats = {}  # the ranks exited (their clean exits are forgotten) before the marker was read
    gone._round_end(round_end.round_ended(tmp_path, "r1"))
    assert gone._ending(2.0) is None  # not killed as "a node keeps failing": the stop's checkpoint is committed
    assert gone._finished(0) == ExitCode.NODE_FAULT
    assert [e.get("step") for e in read_events(tmp_path) if e["event"] == "round_ended"][-1] == 14

    other = Watchdog(RunConfig(command=("x",), run_dir=tmp_path / "o", node="a", round_id="r2"), report=lambda line: None)
    other._handle(beat(0, 14, "step"), 1.0)
    other._handle({"rank": 0, "pid": os.getpid(), "event": "stopped", "step": 14}, 1.1)  # a TERM's stop, no round end
    assert other._finished(0) == ExitCode.OK


def test_ranks_gone_after_another_nodes_round_end_stop_kill_torchrun_at_once(tmp_path):
    """Node a's ranks stopped for node b's round end (not asked by a's watchdog) and are gone:
    a's watchdog kills torchrun at once instead of waiting for it. torchrun's exit barrier
    waits 300 s for the agents of the other nodes, whose watchdogs had already killed theirs:
    a fresh-clone CI's two-node straggler test timed out on exactly that."""
    import time

    from ckpt_tool.errors import ExitCode
    from ckpt_tool.supervise import channel, round_end

    dead = subprocess.Popen(["true"])
    dead.wait()
    w = Watchdog(RunConfig(command=("x",), run_dir=tmp_path, node="a", round_id="r1"), report=lambda line: None)
    w._handle(beat(0, 14, "step", pid=dead.pid), 1.0)
    round_end.end_round(tmp_path, "r1", ["b"], "b", checkpoint_first=True)
    w._handle({"rank": 0, "pid": dead.pid, "event": "stopped", "step": 14}, 1.1)  # before a's watchdog read the marker
    w._handle({"rank": 0, "pid": dead.pid, "event": "exiting"}, 1.2)
    torchrun = subprocess.Popen(["sleep", "60"])  # stands in for a torchrun waiting in its exit barrier
    sock = channel.bind(tmp_path / "s.sock")
    try:
        t0 = time.monotonic()
        assert w._supervise(torchrun, sock) == ExitCode.NODE_FAULT
        assert time.monotonic() - t0 < 5 and torchrun.poll() is not None
    finally:
        torchrun.kill()
        sock.close()
    [ended] = [e for e in read_events(tmp_path) if e["event"] == "round_ended"]
    assert ended["suspects"] == ["b"] and ended["step"] == 14

    # A stop the ranks made of a teardown TERM (no round end): torchrun is left to restart the group.
    other = Watchdog(RunConfig(command=("x",), run_dir=tmp_path / "o", node="a", round_id="r2"), report=lambda line: None)
    other._handle(beat(0, 14, "step", pid=dead.pid), 1.0)
    other._handle({"rank": 0, "pid": dead.pid, "event": "stopped", "step": 14}, 1.1)
    assert not other._stopped_for_good()
