"""The fast tier with real torchrun: two agents on this machine stand for two nodes, each with its
own node-local directory (CKPT_LOCAL_DIR). Rank 0 (node 0's only rank) is killed with SIGKILL at
step 15; the shared tier has step 10, the local tier steps 12 and 14 (every 2 steps, 2 kept)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckpt_tool.core import layout
from ckpt_tool.core.local_tier import rank_dir_name
from ckpt_tool.recipes.launch import FAST_ARGS, compare_runs, node_command, read_metrics, recipe_args

from .conftest import ckpt_cli, ckpt_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # real torchrun (two agents) in every test

STEPS, SAVE_EVERY, CRASH_AT = 20, 10, 15
EXTRA = (*FAST_ARGS, "--global-batch", "8", "--local-every", "2")
RESUMED = re.compile(r"resumed from the local tier, step (\d+) \(newer than the shared tier's (\w+); copies sent: ([^)]*)\)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(root: Path, ckpt: Path, metrics: Path, local_dirs: list[Path], *extra: str) -> list[int]:
    """Both nodes' agents at once, until both exit; their output appended to root/node{i}.log."""
    endpoint = f"127.0.0.1:{free_port()}"
    args = recipe_args(ckpt, metrics, STEPS, SAVE_EVERY, *EXTRA, *extra)
    procs = []
    for node, local in enumerate(local_dirs):
        log = open(root / f"node{node}.log", "ab")
        env = {**os.environ, "CKPT_LOCAL_DIR": str(local), "PYTHONUNBUFFERED": "1"}
        procs.append(
            (
                subprocess.Popen(
                    node_command(node, 2, 1, endpoint, args), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                ),
                log,
            )
        )
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=300))
        finally:
            log.close()
    return codes


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    codes = launch(root, root / "ckpt", root / "metrics.jsonl", [root / "local0", root / "local1"])
    assert codes == [0, 0], (root / "node0.log").read_text()[-3000:]
    return read_metrics(root / "metrics.jsonl")


@pytest.fixture(scope="module")
def crashed_once(tmp_path_factory) -> tuple[Path, Path]:
    """One run whose rank 0 was killed at step 15 (its working directory, and a copy as it was left)."""
    root = tmp_path_factory.mktemp("crashed")
    work = root / "run"
    work.mkdir()
    codes = launch(work, work / "ckpt", work / "metrics.jsonl", [work / "local0", work / "local1"], "--crash-at-step", str(CRASH_AT))
    assert codes[0] != 0
    assert (work / "ckpt" / layout.step_dir_name(SAVE_EVERY)).is_dir()
    shutil.copytree(work, root / "as-left", symlinks=True)
    return work, root / "as-left"


@pytest.fixture
def crashed(crashed_once):
    """That run as it was left, afresh for each test and at the same paths (the index records the
    local directories): (root, ckpt dir, metrics, local dirs)."""
    work, as_left = crashed_once
    shutil.rmtree(work)
    shutil.copytree(as_left, work, symlinks=True)
    return work, work / "ckpt", work / "metrics.jsonl", [work / "local0", work / "local1"]


def local_steps(local: Path, rank: int) -> list[int]:
    steps = [layout.parse_step_dir_name(p.name) for p in (local / rank_dir_name(rank)).iterdir()]
    return sorted(s for s in steps if s is not None)


def resume(root: Path, ckpt: Path, metrics: Path, local: list[Path]) -> tuple[int, str]:
    """Run again to the end; the step it resumed from (the metrics go back to the step after it)
    and, when that was a local step, the copies sent ("" when the shared tier served)."""
    before = len(read_metrics(metrics))
    assert launch(root, ckpt, metrics, local) == [0, 0], (root / "node0.log").read_text()[-3000:]
    found = RESUMED.findall((root / "node0.log").read_text())
    step = read_metrics(metrics)[before].step - 1
    if found:
        assert int(found[-1][0]) == step
    return step, found[-1][2] if found else ""


def test_a_replaced_node_resumes_from_its_peer_copy_at_the_newest_local_step(reference, crashed):
    root, ckpt, metrics, local = crashed
    newest = max(set(local_steps(local[0], 0)) & set(local_steps(local[1], 0)) & set(local_steps(local[1], 1)))
    assert newest > SAVE_EVERY  # the fast tier holds a step the shared tier does not
    listed = ckpt_json("list", ckpt, "--json", timeout=120)["checkpoints"]
    local_rows = {r["step"]: r for r in listed if r["status"] == "local"}
    assert newest in local_rows and all(s > SAVE_EVERY for s in local_rows)  # `ckpt list` shows what is where
    assert local_rows[newest]["path"].startswith("node-local (") and f"{local[1].resolve()}: ranks 0,1" in local_rows[newest]["path"]
    copy = local[1] / rank_dir_name(0) / layout.step_dir_name(newest)
    dcp_to_torch_save(copy, root / "plain.pt")  # a local step is a DCP checkpoint torch's own tools read
    plain = torch.load(root / "plain.pt", weights_only=True)
    assert set(plain) == {"model", "optim"} and "tok.weight" in plain["model"]
    shutil.rmtree(local[0])  # node 0 replaced: its local directory is gone with it
    step, sent = resume(root, ckpt, metrics, local)
    assert step == newest and sent == "rank 0 from rank 1"
    comparison = compare_runs(reference, read_metrics(metrics))
    assert comparison.identical, comparison
    assert not local[0].exists() and not local[1].exists()  # the run finished: the local tier cleaned up


def test_a_damaged_copy_is_detected_and_the_next_newest_step_is_used(reference, crashed):
    root, ckpt, metrics, local = crashed
    shutil.rmtree(local[0])
    kept = local_steps(local[1], 0)  # the copies of rank 0's steps, on node 1
    older = [s for s in kept[:-1] if s > SAVE_EVERY and s in local_steps(local[1], 1)]
    shard = local[1] / rank_dir_name(0) / layout.step_dir_name(kept[-1]) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    step, _ = resume(root, ckpt, metrics, local)
    assert step == (max(older) if older else SAVE_EVERY)
    assert "is damaged" in (root / "node1.log").read_text()
    comparison = compare_runs(reference, read_metrics(metrics))
    assert comparison.identical, comparison


def test_a_step_not_complete_on_every_rank_is_not_resumed_and_its_leftovers_are_deleted(reference, crashed):
    """Rank 0's files of the newest step are nowhere (its node replaced, the copy lost): the step
    before serves, and rank 1's files of the newest step are deleted, never mixed with the files
    this run saves again under the same step number."""
    root, ckpt, metrics, local = crashed
    newest = max(local_steps(local[1], 1))
    shutil.rmtree(local[0])
    shutil.rmtree(local[1] / rank_dir_name(0) / layout.step_dir_name(newest), ignore_errors=True)
    step, _ = resume(root, ckpt, metrics, local)
    assert step < newest
    assert f"rank 1 step {newest}" in (root / "node1.log").read_text()
    comparison = compare_runs(reference, read_metrics(metrics))
    assert comparison.identical, comparison


def test_a_local_step_that_fails_the_probe_check_is_not_used(reference, crashed):
    """Hashes match but the re-measured probe does not (the recorded loss changed here): the
    shared tier serves, as for a shared checkpoint that fails verification."""
    root, ckpt, metrics, local = crashed
    newest = max(set(local_steps(local[0], 0)) & set(local_steps(local[1], 1)))
    manifest = local[0] / rank_dir_name(0) / layout.step_dir_name(newest) / layout.MANIFEST_NAME
    data = json.loads(manifest.read_text())
    assert data["probe"] is not None and data["probe"]["step"] == newest  # measured at the local save
    data["probe"]["loss"] += 0.5
    manifest.write_text(json.dumps(data))
    step, sent = resume(root, ckpt, metrics, local)
    assert (step, sent) == (SAVE_EVERY, "")
    assert "rank 0: verify" in (root / "node0.log").read_text()
    comparison = compare_runs(reference, read_metrics(metrics))
    assert comparison.identical, comparison


def test_with_both_local_directories_gone_the_shared_tier_serves(reference, crashed):
    root, ckpt, metrics, local = crashed
    for d in local:
        shutil.rmtree(d)
    step, sent = resume(root, ckpt, metrics, local)
    assert (step, sent) == (SAVE_EVERY, "")
    comparison = compare_runs(reference, read_metrics(metrics))
    assert comparison.identical, comparison


def test_a_local_directory_too_small_turns_the_tier_off_and_training_goes_on(reference, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        local = [tmp_path / "local0", small / "local1"]
        assert launch(tmp_path, tmp_path / "ckpt", tmp_path / "metrics.jsonl", local) == [0, 0]
        log = (tmp_path / "node0.log").read_text()
        assert "local tier off for this run" in log and "a tmpfs too small?" in log, log[-3000:]
        assert not any(p.is_file() for p in small.rglob("*"))  # nothing half-written left in it
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    comparison = compare_runs(reference, read_metrics(tmp_path / "metrics.jsonl"))
    assert comparison.identical and comparison.steps_compared == STEPS, comparison


def test_local_steps_saved_before_a_rollback_of_the_shared_tier_are_not_resumed(tmp_path):
    """`ckpt rollback` is the user's word: a newer local step must not undo it."""
    local = [tmp_path / "local0", tmp_path / "local1"]
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    launch(tmp_path, ckpt, metrics, local, "--crash-at-step", str(CRASH_AT), "--save-every", "5")
    assert local_steps(local[0], 0) and max(local_steps(local[0], 0)) > 10
    proc = ckpt_cli("rollback", ckpt, "--to", "5")
    assert proc.returncode == 0, proc.stderr
    assert not [r for r in ckpt_json("list", ckpt, "--json", timeout=120)["checkpoints"] if r["status"] == "local"]
    step, sent = resume(tmp_path, ckpt, metrics, local)
    assert (step, sent) == (5, "")
    assert "saved before the shared tier's last rollback" in (tmp_path / "node0.log").read_text()
