"""HSDP (real torchrun, gloo, CPU): the reference recipe with ``--replicate 2`` on 4 ranks is FSDP2
over a (dp_replicate 2, dp_shard 2) mesh. Killed mid-run and resumed with the same command, every
re-run step's loss, LR and gradient norm equal the first pass's bit for bit (the resume reads each
replicated shard once and sends it to its replica: the cooperative load); the same checkpoint
continued on another replicate size (plain FSDP over the 4 ranks) keeps the global batch and stays
within 1e-4 of the trajectory. ``ckpt verify --nproc 4`` checks it on the saved HSDP mesh, bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tool.recipes.launch import FAST_ARGS, compare_runs, read_metrics, recipe_args, run, torchrun_command
from ckpt_tool.store.store import CheckpointStore

from .conftest import ckpt_cli

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY, CRASH_AT = 12, 4, 12  # SIGKILL at the start of step 12: LATEST is 8, steps 9-11 are re-run
LOSS_TOLERANCE = 1e-4


def launch(root: Path, nproc: int, replicate: int, *extra: str) -> Path:
    metrics = root / "metrics.jsonl"
    args = recipe_args(
        root / "ckpt",
        metrics,
        STEPS,
        SAVE_EVERY,
        *FAST_ARGS,
        "--global-batch",
        "8",
        "--micro-batch",
        "2",
        "--replicate",
        str(replicate),
        *extra,
    )
    code = run(torchrun_command(nproc, args), root / "log.txt", timeout=600, env={"OMP_NUM_THREADS": "1"})
    if code != 0 and "--crash-at-step" not in extra:
        raise AssertionError((root / "log.txt").read_text()[-4000:])
    return metrics


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    """2 x 2 HSDP without dropout, SIGKILLed at step 12 and restarted with the same command."""
    root = tmp_path_factory.mktemp("hsdp")
    launch(root, 4, 2, "--dropout", "0", "--crash-at-step", str(CRASH_AT))
    launch(root, 4, 2, "--dropout", "0", "--crash-at-step", str(CRASH_AT))
    return root


def test_hsdp_crash_and_resume_is_bit_identical(crashed):
    lines = read_metrics(crashed / "metrics.jsonl")
    first, resumed = lines[: CRASH_AT - 1], lines[CRASH_AT - 1 :]
    assert [m.step for m in first] == list(range(1, CRASH_AT)) and [m.step for m in resumed] == list(range(9, STEPS + 1))
    comparison = compare_runs([m for m in first if m.step > 8], [m for m in resumed if m.step < CRASH_AT])
    assert comparison.identical and comparison.lines_compared == 3, comparison.mismatches[:3]
    manifest = CheckpointStore(crashed / "ckpt").read_manifest(STEPS)
    assert manifest.layout.dims == (("dp_replicate", 2), ("dp_shard", 2))
    assert manifest.batch is not None and manifest.batch.dp_size == 4 and manifest.batch.global_batch == 8
    assert "resumed from step 8" in (crashed / "log.txt").read_text()
    # `ckpt verify --nproc 4` checks it on the saved HSDP mesh: bit for bit
    proc = ckpt_cli("verify", crashed / "ckpt", "--nproc", "4", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exact"] and report["ok"] and report["mesh"] == report["saved_mesh"] == "dp_replicate=2,dp_shard=2"


def test_hsdp_checkpoint_continues_on_another_replicate_size(crashed, tmp_path):
    nproc, replicate = 4, 1  # plain FSDP over the 4 ranks
    root = tmp_path / "switched"
    shutil.copytree(crashed, root)
    (root / "metrics.jsonl").unlink()
    assert ckpt_cli("rollback", root / "ckpt", "--to", "8", timeout=600).returncode == 0
    metrics = launch(root, nproc, replicate, "--dropout", "0")
    store = CheckpointStore(root / "ckpt")
    after = store.read_manifest(STEPS)
    assert after.world_size == nproc and after.batch is not None and after.batch.global_batch == 8
    assert after.layout.size("dp_replicate") == replicate
    [event] = [e for e in store.events() if e.event == "reshard"]
    assert event.data["batch"]["mesh"]["old"] == "dp_replicate=2,dp_shard=2"
    ref = {m.step: m for m in read_metrics(crashed / "metrics.jsonl")}  # its last lines: the resumed 9-12
    resumed = {m.step: m for m in read_metrics(metrics)}
    assert sorted(resumed) == list(range(9, STEPS + 1))
    worst = max(abs(resumed[s].loss - ref[s].loss) / abs(ref[s].loss) for s in resumed)
    print(f"HSDP 2x2 -> {nproc} ranks, replicate {replicate}: max relative loss difference {worst:.3g}")
    assert worst < LOSS_TOLERANCE
    assert all(resumed[s].lr == ref[s].lr for s in resumed)
