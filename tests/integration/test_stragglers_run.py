"""`ckpt run` (2 ranks of the reference recipe) with a rank made slow, and with the fake NVML:
stragglers and GPUs are reported with their rank and node, and a GPU hardware error ends the
round after a checkpoint; a normal run (checkpoints, a data stall, a restart), scored for
seconds in each attempt, names none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_tool.core.stragglers import StragglerPolicy
from ckpt_tool.errors import ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.supervise.rank_vitals import read_rank_health
from ckpt_tool.supervise.round_end import node_name
from ckpt_tool.supervise.run_dir import read_events

from .conftest import assert_identical_to_reference, assert_no_straggler, ckpt_json

pytestmark = pytest.mark.slow

SLOW_FROM = 10
ROOT = Path(__file__).resolve().parents[2]


def test_a_slow_rank_is_named_within_the_bound_and_the_training_is_unchanged(reference_run, supervised):
    # ~0.3 s more compute a step on rank 1 from step 10: at least 3x its peer's (~0.05-0.1 s here)
    s = supervised("--slow-rank", "1", "--slow-ms", "300", "--slow-from-step", str(SLOW_FROM))
    assert s.run() == ExitCode.OK, s.log_tail()
    [found] = [e for e in s.events() if e["event"] == "straggler"]
    assert (found["rank"], found["node"], found["phase"]) == (1, node_name(), "compute"), found
    assert found["slower_x"] >= 2.0 and found["score"] < 0.7
    delay = found["step"] - SLOW_FROM + 1  # the step its timing is of; its beat is one step later
    # the bound for steps at least as long as the slow rank's compute (~0.35 s: 5 s in 15 steps, 18)
    assert delay + 1 <= StragglerPolicy().bound_steps(found["time_s"]), found
    assert_identical_to_reference(reference_run, s)  # a slow rank slows the job, it changes no number
    report = ckpt_json("status", s.run_dir, "--json", timeout=60)
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[1]["straggler"] and ranks[1]["node"] == node_name() and not ranks[0]["straggler"]
    assert ranks[1]["compute_s"] > 2 * ranks[0]["compute_s"] and ranks[0]["wait_s"] > ranks[1]["wait_s"]
    [node] = report["health"]["nodes"]
    assert node["stragglers"] == 1 and node["flagged"] is None and report["health"]["suspects"] == []  # counted, not acted on


def test_a_normal_run_scored_for_seconds_names_no_straggler(supervised):
    """The default policy (rolling medians over at least 5 s of steps) on a run long enough to
    be scored in both of its attempts: checkpoints every 10 steps (rank 0 commits), a 6 s data
    stall of rank 0 at step 80, rank 1 SIGKILLed at step 120, the restart and resume. The ranks
    were scored before the kill and after the restart (their windows full), and no straggler,
    idle GPU or GPU error is named. (The shorter runs of test_run_watchdog end before 5 s of
    steps: their windows never fill.)"""
    # 200 steps after the kill: at ~0.03-0.1 s a step, its window (5 s of steps) fills with room to spare
    s = supervised("--data-stall-at-step", "80", "--data-stall-s", "6", steps=320, save_every=10).start()
    s.wait_for_step(120, timeout=180)
    before = read_rank_health(s.run_dir)
    assert [(r["rank"], r["node"]) for r in before] == [(0, node_name()), (1, node_name())], before  # scored in attempt 0
    victim = s.rank_list()[-1]
    victim.send_signal(signal.SIGKILL)
    assert s.wait() == ExitCode.OK, s.log_tail()
    events = s.events()
    assert any(e["event"] == "restarted" for e in events)
    assert_no_straggler(s)
    after = json.loads((s.run_dir / f"rank_health.{node_name()}.json").read_text())
    assert after["attempt"] == 1 and [r["rank"] for r in after["ranks"]] == [0, 1], after  # scored after the restart
    assert all(0.75 < r["score"] <= 1 for r in after["ranks"]), after


def test_an_idle_gpu_is_reported_and_an_xid_ends_the_round_after_a_checkpoint(supervised, tmp_path):
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": [{"index": 0, "util": 0}, {"index": 1, "util": 100}]}))  # rank 0's GPU idles
    s = supervised(steps=400, save_every=50)
    s.start(env={"CKPT_FAKE_NVML": str(nvml)})
    deadline = time.monotonic() + 120
    while not [e for e in s.events() if e["event"] == "gpu_idle"] and time.monotonic() < deadline:
        time.sleep(0.5)
    [idle] = [e for e in s.events() if e["event"] == "gpu_idle"]
    assert (idle["rank"], idle["gpu"], idle["node"]) == (0, 0, node_name())
    nvml.write_text(json.dumps({"gpus": [{"index": 0, "util": 95}, {"index": 1, "util": 100, "xids": [79]}]}))  # GPU fell off the bus
    assert s.wait() == ExitCode.NODE_FAULT, s.log_tail()
    events = s.events()
    [error] = [e for e in events if e["event"] == "gpu_error"]
    assert error["rank"] == 1 and error["xids"] == [79] and error["suspect"] is True
    [ended] = [e for e in events if e["event"] == "round_ended"]
    assert ended["suspects"] == [node_name()]
    store = CheckpointStore(s.ckpt)
    assert store.read_latest() == ended["step"] and ended["step"] % 50 != 0  # the stop's own checkpoint: no work lost
    assert store.check_files(ended["step"]).ok
    health = json.loads((s.run_dir / "health.json").read_text())
    assert health["suspects"] == [node_name()] and "GPU 1 (rank 1): XID 79" in health["nodes"][0]["flagged"]


def test_straggler_suspect_across_two_nodes_ends_the_round_on_both_after_one_checkpoint(tmp_path):
    """Two `ckpt run` agents on this machine as nodes a and b of one round (1 rank each, c10d
    rendezvous), --straggler-suspect, the rank of node b slowed: b's watchdog names it, ends the
    round after a checkpoint, and a's watchdog, whose rank stopped for it, ends the round too."""
    from ckpt_tool.recipes.launch import FAST_ARGS, recipe_args
    from ckpt_tool.slurm.job import free_port

    ckpt, run_dir, port = tmp_path / "ckpt", tmp_path / "run", free_port()
    procs = {}
    for node in ("a", "b"):
        args = recipe_args(ckpt, tmp_path / "metrics.jsonl", 400, 50, *FAST_ARGS)
        argv = [sys.executable, "-m", "ckpt_tool.cli.main", "run", "--nproc-per-node=1", "--nnodes=2", f"--rdzv-endpoint=127.0.0.1:{port}"]
        argv += ["--rdzv-id=two", "--run-dir", str(run_dir), "--straggler-suspect", "--", "-m", "tests.integration.slow_node", *args]
        env = {
            **os.environ,
            "SLURMD_NODENAME": node,
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
            "SLOW_NODE": "b",
            "PYTHONUNBUFFERED": "1",
        }
        with open(tmp_path / f"{node}.log", "wb") as log:
            procs[node] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(0.5)
    codes = {n: p.poll() for n, p in procs.items()}  # None: still running (shown with the logs)
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, 9)
    logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in procs}
    assert codes == {"a": ExitCode.NODE_FAULT, "b": ExitCode.NODE_FAULT}, logs
    events = read_events(run_dir)
    [found] = [e for e in events if e["event"] == "straggler"]
    assert found["node"] == "b" and found["suspect"] is True
    ends = [e for e in events if e["event"] == "round_ended"]
    assert sorted(e["node"] for e in ends) == ["a", "b"] and all(e["suspects"] == ["b"] for e in ends)
    step = CheckpointStore(ckpt).read_latest()
    assert step is not None and step % 50 != 0 and {e["step"] for e in ends} == {step}  # the stop's own checkpoint
    health = json.loads((run_dir / "health.json").read_text())
    assert health["suspects"] == ["b"]
