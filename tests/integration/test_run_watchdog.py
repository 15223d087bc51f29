"""ckpt run: torchrun (2 ranks, the reference recipe) under the watchdog, with real failures:
SIGKILL of a rank, SIGSTOP of a rank (a hang), slow checkpoints and data stalls (no false alarm),
SIGUSR1 (checkpoint, exit "requeue", resume), and a crash loop. No test leaves a process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ckpt_tool.cli.runs import read_timeline
from ckpt_tool.core.account import account
from ckpt_tool.errors import ExitCode
from ckpt_tool.recipes.launch import read_metrics
from ckpt_tool.store.store import CheckpointStore

from .conftest import assert_identical_to_reference, assert_no_straggler, ckpt_cli, ckpt_json

pytestmark = pytest.mark.slow


def test_sigkill_of_a_rank_is_detected_restarted_and_exact(reference_run, supervised):
    s = supervised().start()
    s.wait_for_step(12)
    victim = s.rank_list()[-1]
    reached = max(m.step for m in read_metrics(s.metrics))
    killed_at = time.time()
    victim.send_signal(signal.SIGKILL)
    back_at = training_again(s, reached)
    assert s.wait() == ExitCode.OK, s.log_tail()
    ended_at = time.time()
    events = s.events()
    exits = [e for e in events if e["event"] == "rank_exited"]
    # the victim first, killed without a word; its peer's exit follows as a victim of it
    assert (exits[0]["pid"], exits[0]["cause"]) == (victim.pid, "killed"), exits
    assert exits[0]["time"] - killed_at < 2.0, "rank death not seen within 2 s"
    assert all(e["cause"] in ("peer_failure", "terminated") for e in exits[1:]), exits
    assert any(e["event"] == "restarted" for e in events)
    assert_identical_to_reference(reference_run, s)
    assert_no_straggler(s)
    # the account of the run's time against the clock this test kept outside it: within 2% of the wall time
    acct = account(read_timeline(s.run_dir, s.ckpt)[1])
    wall = ended_at - s.started_at
    [crash] = acct.interruptions
    print(f"account {acct.wall_s:.3f} s, clock {wall:.3f} s; failure {crash.time - killed_at:+.3f} s after the kill; "
          f"back {crash.time + crash.down_s - back_at:+.3f} s from the first step seen again")  # fmt: skip
    assert abs(acct.wall_s - wall) <= 0.02 * wall, (acct.wall_s, wall)
    assert abs(crash.time - killed_at) <= 0.02 * wall, (crash.time, killed_at)
    assert abs(crash.time + crash.down_s - back_at) <= 0.02 * wall, (crash.time + crash.down_s, back_at, crash.seconds)
    assert crash.steps_recomputed == reached - crash.resumed_from or crash.steps_recomputed == reached + 1 - crash.resumed_from
    assert acct.totals()["checkpoint"] > 0  # every commit says how long its save blocked the training
    # the story as a picture: progress on a wall clock with the failure's cost shaded, the loss below
    pytest.importorskip("matplotlib")
    drawn = ckpt_json("history", s.run_dir, "--plot", s.root / "story.png", "--metrics", s.metrics, "--json", timeout=120)
    assert drawn["plot"] == str(s.root / "story.png")
    assert (s.root / "story.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def training_again(s, reached: int, timeout: float = 120) -> float:
    """When rank 0 logs a step it had already trained (the first step after the restart's load),
    polled every 10 ms from outside."""
    seen = len(read_metrics(s.metrics))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = read_metrics(s.metrics)
        if len(rows) > seen and any(m.step <= reached for m in rows[seen:]):
            return time.time()
        time.sleep(0.01)
    raise AssertionError(f"no step after the restart within {timeout} s: {s.log_tail()}")


def test_sigstop_hang_is_detected_within_10s_and_recovered(reference_run, supervised):
    # saves every 10 steps and a stop at step 12: the frozen rank is inside a training step, not a
    # checkpoint write (a hang there is caught after the checkpoint timeout, tested in unit tests)
    s = supervised(save_every=10, run_opts=("--grace", "20")).start()
    s.wait_for_step(12)
    victim = s.rank_list()[0]
    stopped_at = time.time()
    victim.send_signal(signal.SIGSTOP)
    assert s.wait() == ExitCode.OK, s.log_tail()
    events = s.events()
    hangs = [e for e in events if e["event"] == "hang"]
    assert hangs, s.log_tail()
    assert hangs[0]["time"] - stopped_at <= 10.0
    assert hangs[0]["timeout_s"] <= 10.0
    [killed] = [e for e in events if e["event"] == "killed_ranks"]
    # the frozen rank is SIGKILLed at once and its peer fails fast: no waiting the 20 s grace
    assert killed["teardown_s"] < 10, killed
    assert any(e["event"] == "restarted" for e in events)
    assert_identical_to_reference(reference_run, s)
    timeouts = json.loads((s.run_dir / "timeouts.json").read_text())
    assert timeouts["durations"]["step"], "calibration data is persisted for the next start"


def test_slow_checkpoints_and_a_data_stall_are_not_hangs(supervised):
    # Sync saves made ~30x slower than a step (3 s vs ~0.1 s) and a 10 s data stall of rank 0 at
    # step 15 (twice the step phase's 5 s timeout), once the straggler scores are warm: neither a
    # hang nor a straggler.
    s = supervised("--save-delay", "3", "--data-stall-at-step", "15", "--data-stall-s", "10", steps=24, save_every=8)
    assert s.run() == ExitCode.OK, s.log_tail()
    names = [e["event"] for e in s.events()]
    assert "hang" not in names and "rank_exited" not in names and "restarted" not in names, names
    assert names[-1] == "finished"
    assert_no_straggler(s)


def test_sigusr1_checkpoints_exits_requeue_and_resumes(reference_run, supervised):
    s = supervised().start()
    s.wait_for_step(17)
    signalled_at = time.time()
    os.kill(s.proc.pid, signal.SIGUSR1)
    assert s.wait() == ExitCode.REQUEUE, s.log_tail()
    events = s.events()
    assert [e["purpose"] for e in events if e["event"] == "stop_requested"] == ["requeue"], s.log_tail()
    stopped = [e for e in events if e["event"] == "stopped_for_requeue"]
    assert stopped, s.log_tail()
    step = stopped[0]["step"]
    # The checkpoint is the stop's own, at the step boundary after the signal: the last step trained
    # (none after it), committed after the signal; not the periodic one (every 5 steps) before it.
    assert step >= 17 and max(m.step for m in read_metrics(s.metrics)) == step
    store = CheckpointStore(s.ckpt)
    assert store.read_latest() == step and store.check_files(step).ok
    [commit] = [e for e in store.events() if e.event == "commit" and e.step == step]
    assert commit.time >= signalled_at, (commit, signalled_at)
    again = supervised(name="again")
    again.argv = s.argv  # the same job, started again (as SLURM's requeue does)
    again.root = s.root
    assert again.run() == ExitCode.OK, again.log_tail()
    lines = read_metrics(s.metrics)
    assert [m.step for m in lines if m.step > step][0] == step + 1  # resumed right after the checkpoint
    assert_identical_to_reference(reference_run, s)
    assert_no_straggler(again)


def test_crash_loop_is_stopped_with_a_clear_message(supervised):
    s = supervised("--crash-at-step", "8", "--crash-repeat", run_opts=("--crash-loop", "2", "--max-restarts", "5"))
    assert s.run() == ExitCode.CRASH_LOOP, s.log_tail()
    [loop] = [e for e in s.events() if e["event"] == "crash_loop"]
    assert "2 failures in a row without a new checkpoint (past checkpoint step 5)" in loop["message"]
    # the whole log: torchrun's traceback on the teardown SIGTERM may be written after ckpt run's line
    assert "crash loop" in s.log_tail(chars=10**7)


def test_a_fresh_run_logs_no_resume_and_ends_with_a_checkpoint_of_its_last_step(supervised):
    """12 steps, a checkpoint every 5: steps 5 and 10 as configured, and 12, the last step, at
    close(). A fresh start is not a resume, even after its first checkpoint is committed."""
    s = supervised(steps=12, save_every=5)
    assert s.run() == ExitCode.OK, s.log_tail()
    assert "resumed" not in [e["event"] for e in s.events()]
    store = CheckpointStore(s.ckpt)
    assert store.committed_on_disk() == [5, 10, 12] and store.read_latest() == 12
    assert [m.step for m in read_metrics(s.metrics)] == list(range(1, 13))


def test_a_configuration_error_is_fatal_at_once_with_the_ranks_message(supervised):
    """Bad arguments (exit 2) and a checkpoint that does not fit the model (exit 4) would fail
    again after every restart: `ckpt run` stops at once with the rank's exit code and message
    instead of restarting, and never calls it a crash loop."""
    first = supervised(steps=5, save_every=5, name="first")
    assert first.run() == ExitCode.OK, first.log_tail()
    misfit = supervised("--d-model", "32", steps=10, save_every=5, name="misfit")  # FAST_ARGS say 64; the later flag wins
    misfit.ckpt = first.ckpt
    misfit.argv = [a if a != str(misfit.root / "ckpt") else str(first.ckpt) for a in misfit.argv]
    t0 = time.monotonic()
    assert misfit.run() == ExitCode.CONFLICT, misfit.log_tail()
    assert time.monotonic() - t0 < 60
    events = misfit.events()
    [fatal] = [e for e in events if e["event"] == "fatal"]
    assert fatal["exit_code"] == 4 and "does not fit" in fatal["message"]
    assert not [e for e in events if e["event"] in ("restarted", "crash_loop")]
    assert CheckpointStore(first.ckpt).committed_on_disk() == [5] and not (first.ckpt / "quarantine").exists()

    bad_args = supervised("--steps", "many", name="bad-args")
    assert bad_args.run() == ExitCode.USAGE, bad_args.log_tail()
    [fatal] = [e for e in bad_args.events() if e["event"] == "fatal"]
    assert "invalid int value: 'many'" in fatal["message"]
    assert not [e for e in bad_args.events() if e["event"] in ("restarted", "crash_loop")]


def test_the_run_directory_is_ckpt_dir_run_for_ckpt_run_and_ckpt_status(supervised):
    s = supervised(steps=6, save_every=3, name="by-ckpt-dir")
    s.argv = list(s.argv)
    i = s.argv.index("--run-dir")
    s.argv[i : i + 2] = ["--ckpt-dir", str(s.ckpt), "--json"]
    s.run_dir = s.ckpt / "run"
    assert s.run() == ExitCode.OK, s.log_tail()
    assert [e["event"] for e in s.events()][-1] == "finished"
    printed = [json.loads(line) for line in s.log_tail().splitlines() if line.startswith('{"')]  # --json: one event per line
    assert [e["event"] for e in printed][-1] == "finished" and printed == s.events()[-len(printed) :]
    report = ckpt_json("status", s.ckpt, "--json", timeout=60)
    assert report["run_dir"] == str(s.ckpt / "run") and report["newest_checkpoint"] == 6
    assert [e["event"] for e in report["last_events"]][-1] == "finished"
    no_dir = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "run", "--", "train.py"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "CKPT_DIR"},
    )
    assert no_dir.returncode == 2 and "--ckpt-dir" in no_dir.stderr


def test_a_warm_import_that_does_not_exist_is_a_usage_error_before_anything_starts(tmp_path):
    done = ckpt_cli("run", "--run-dir", tmp_path / "run", "--warm-import", "no_such_module_xyz", "--", "t.py", timeout=60)
    assert done.returncode == ExitCode.USAGE
    assert "--warm-import no_such_module_xyz: no module 'no_such_module_xyz'" in done.stderr and "leave --warm-import out" in done.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()
