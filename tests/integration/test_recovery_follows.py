"""The ranks' resume takes `ckpt recover`'s decision (RUN_DIR/recover.json) while it is current,
and plans itself when it is stale (real torchrun, gloo, the reference recipe's checkpoints: 2
ranks, steps 5..20). The rules on plain data: tests/unit/test_recovery_recorded.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tool.core import layout
from ckpt_tool.core.recovery import stale_because
from ckpt_tool.ops.recover import recover
from ckpt_tool.recipes.launch import FAST_ARGS, read_metrics, recipe_args, run, torchrun_command
from ckpt_tool.store import recovery
from ckpt_tool.store.store import CheckpointStore

from .conftest import ckpt_cli

pytestmark = pytest.mark.slow


def shard(ckpt: Path, step: int, name: str = "__0_0.distcp") -> Path:
    return ckpt / layout.step_dir_name(step) / name


def resume(ckpt: Path, root: Path, nproc: int, run_dir: Path, steps: int = 25) -> str:
    """The recipe resumed in ``ckpt`` on ``nproc`` ranks, told RUN_DIR as `ckpt run` tells it;
    returns its log."""
    log, metrics = root / f"resume{nproc}.log", root / f"m{nproc}.jsonl"
    args = recipe_args(ckpt, metrics, steps, 5, *FAST_ARGS, "--dropout", "0")
    code = run(torchrun_command(nproc, args), log, timeout=300, env={"OMP_NUM_THREADS": "1", "CKPT_RUN_DIR": str(run_dir)})
    text = log.read_text()
    assert code == 0, text[-3000:]
    return " ".join(text.split())


def first_step(root: Path, nproc: int) -> int:
    return read_metrics(root / f"m{nproc}.jsonl")[0].step


def test_recover_records_what_makes_its_decision_current(ckpt, tmp_path):
    run_dir = tmp_path / "run"
    decision = recover(ckpt, 2, run_dir)
    recorded, store = recovery.read_recorded(run_dir), CheckpointStore(ckpt)
    where, size = recovery.identity(store)
    assert recorded is not None and recorded.step == decision.step == store.read_latest() == 20
    assert (decision.store, decision.facts) == (where, size) and stale_because(recorded, where, 20, size, 2) is None
    assert json.loads((run_dir / "recover.json").read_text())["facts"] == size
    store.append_event("verified", step=20)  # an index line is no new fact: still current
    assert recovery.identity(store) == (where, size)
    (ckpt / ".step_00000025.partial").mkdir()  # a leftover of a crash is: stale until the clean-up
    assert recovery.identity(store)[1] != size


def test_the_ranks_do_what_recover_decided_rollback_and_reshard(ckpt, tmp_path):
    """recover finds step 20 cut short, quarantines it, rolls back to 15 and plans the reshard
    from 2 ranks to 1; the one rank takes that step (said on its resume line) and trains with
    recover's batch split."""
    path = shard(ckpt, 20)
    path.write_bytes(path.read_bytes()[:-100])
    run_dir = tmp_path / "run"
    decided = json.loads(ckpt_cli("recover", ckpt, "--world-size", "1", "--run-dir", run_dir, "--json").stdout)
    assert (decided["step"], decided["rolled_back_from"], decided["quarantined"]) == (15, 20, [20])
    log = resume(ckpt, tmp_path, 1, run_dir)
    assert f"step 15, as `ckpt recover` decided ({run_dir / 'recover.json'}; its structure check stands" in log, log[-3000:]
    assert "not followed" not in log and "differs from `ckpt recover`'s plan" not in log
    assert first_step(tmp_path, 1) == 16
    batch = CheckpointStore(ckpt).read_manifest(25).batch
    assert {
        "micro_batch": batch.micro_batch,
        "grad_accum": batch.grad_accum,
        "dp_size": batch.dp_size,
        "global_batch": batch.global_batch,
    } == (decided["reshard"]["new"])


def test_a_stale_decision_is_not_followed(ckpt, tmp_path):
    """recover chose step 20; a rollback to 15 came after it: the ranks say why they do not
    follow recover.json and resume where LATEST now points."""
    run_dir = tmp_path / "run"
    assert recover(ckpt, 2, run_dir).step == 20
    assert ckpt_cli("rollback", ckpt, "--to", "15").returncode == 0
    log = resume(ckpt, tmp_path, 2, run_dir)
    assert f"{run_dir / 'recover.json'} is not followed (it chose step 20 and LATEST now names step 15); choosing the step here" in log
    assert "as `ckpt recover` decided" not in log
    assert first_step(tmp_path, 2) == 16


def test_damage_found_while_loading_recovers_step_goes_back_through_the_planner(ckpt, tmp_path):
    """A flipped bit keeps every size, so recover (no --full) chooses step 20; the ranks follow
    it, their load-time hash check finds the damage, and the planner's Damaged quarantines 20 and
    sends every rank back to 15 together."""
    run_dir = tmp_path / "run"
    assert recover(ckpt, 2, run_dir).step == 20
    raw = bytearray(shard(ckpt, 20).read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard(ckpt, 20).write_bytes(bytes(raw))
    log = resume(ckpt, tmp_path, 2, run_dir)
    assert "step 20, as `ckpt recover` decided" in log and "checkpoint step 20 is damaged" in log, log[-3000:]
    assert first_step(tmp_path, 2) == 16
    store = CheckpointStore(ckpt)
    [q] = [e for e in store.events() if e.event == "quarantine"]
    assert q.step == 20 and "hash" in q.data["reason"]
