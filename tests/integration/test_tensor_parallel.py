"""Tensor parallel x FSDP (real torchrun, gloo, CPU): the reference recipe on a (dp_shard, tp) mesh.

* Same mesh (tp 2 x dp 2, 4 ranks), with dropout: SIGKILLed mid-run and resumed, every re-run
  step's loss, LR and gradient norm equal the uninterrupted first pass's bit for bit.
* The same checkpoint continued on tp 2 x dp 1 and on tp 1 x dp 2 with the identical command
  apart from the rank count and ``--tp``: the global batch is kept, every sample of the epoch is
  used once, the losses stay within 1e-4 (relative) of the uninterrupted run (dropout off).
* ``ckpt reshard --out`` between meshes copies the parameters bit for bit; ``ckpt verify``
  reproduces the probe on the saved mesh exactly; a tp size that does not fit is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ckpt_tool.recipes.data import Corpus, GlobalSampler
from ckpt_tool.recipes.gpt_model import GPTConfig
from ckpt_tool.recipes.launch import FAST_ARGS, RecipeJob, compare_runs, read_metrics, recipe_args, run, torchrun_command
from ckpt_tool.store.store import CheckpointStore

from .conftest import ckpt_cli, newest_per_step

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY, CRASH_AT = 12, 4, 12  # SIGKILL at the start of step 12: LATEST is 8, steps 9-11 are re-run
BATCH = ("--global-batch", "8", "--micro-batch", "2")  # tp 2 x dp 2: 2 x 2 x 2; dp 1: 2 x 4 x 1
LOSS_TOLERANCE = 1e-4  # relative, as the issue asks; measured: see the printed figures


def launch(root: Path, nproc: int, tp: int, *extra: str, ckpt: Path | None = None) -> Path:
    metrics = root / f"metrics-{nproc}x{tp}.jsonl"
    args = recipe_args(
        ckpt or root / "ckpt",
        metrics,
        STEPS,
        SAVE_EVERY,
        *FAST_ARGS,
        *BATCH,
        "--tp",
        str(tp),
        "--log-samples",
        str(root / "samples"),
        *extra,
    )
    code = run(torchrun_command(nproc, args), root / "log.txt", timeout=600, env={"OMP_NUM_THREADS": "1"})
    if code != 0 and "--crash-at-step" not in extra:
        raise AssertionError((root / "log.txt").read_text()[-4000:])
    return metrics


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted tp 2 x dp 2 run without dropout: checkpoints at 4, 8, 12."""
    root = tmp_path_factory.mktemp("tp-reference")
    launch(root, 4, 2, "--dropout", "0", "--keep-last", "3")
    return root


def test_same_mesh_crash_and_resume_is_bit_identical_with_dropout(tmp_path):
    root = tmp_path / "crashed"
    root.mkdir()
    metrics = launch(root, 4, 2, "--crash-at-step", str(CRASH_AT))  # dropout 0.1; rank 0 is SIGKILLed at step 12
    first = read_metrics(metrics)
    assert [m.step for m in first] == list(range(1, CRASH_AT)) and CheckpointStore(root / "ckpt").read_latest() == 8
    launch(root, 4, 2, "--crash-at-step", str(CRASH_AT))  # the same command, restarted: steps 9-12
    # Up to the SIGKILL the first run was uninterrupted: it is the reference for steps 9-11, which
    # the resumed run trains again from step 8's checkpoint (model, AdamW, schedule, RNG, data).
    resumed = read_metrics(metrics)[len(first) :]
    assert [m.step for m in resumed] == list(range(9, STEPS + 1))
    comparison = compare_runs([m for m in first if m.step > 8], [m for m in resumed if m.step < CRASH_AT])
    assert comparison.identical, comparison.mismatches[:3]
    assert comparison.lines_compared == 3
    manifest = CheckpointStore(root / "ckpt").read_manifest(STEPS)
    assert manifest.layout.dims == (("dp_shard", 2), ("tp", 2))
    assert dict(manifest.layout.to_json()["must_divide"]["tp"]) == {"attention heads": 4, "MLP hidden size": 256}
    assert manifest.batch is not None and manifest.batch.dp_size == 2  # the batch is split over dp, not the 4 ranks
    # the ckpt verify probe on the saved mesh (--tp defaults to the saved 2) is bit-exact
    proc = ckpt_cli("verify", root / "ckpt", "--nproc", "4", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exact"] and report["ok"] and report["mesh"] == report["saved_mesh"] == "dp_shard=2,tp=2"


def tp_peers_share_samples_and_each_is_used_once(root: Path, global_batch: int) -> None:
    entries = [json.loads(line) for f in root.glob("samples.rank*.jsonl") for line in f.read_text().splitlines()]
    last_run = {}
    for e in entries:
        last_run[e["step"]] = max(last_run.get(e["step"], -1), e["resumed_from"])
    by_dp: dict[int, dict[int, list[int]]] = {}
    for e in entries:
        if e["resumed_from"] != last_run[e["step"]]:
            continue
        seen = by_dp.setdefault(e["step"], {}).setdefault(e["dp_rank"], e["indices"])
        assert seen == e["indices"], f"step {e['step']}: tensor-parallel peers of dp rank {e['dp_rank']} took different samples"
    sampler = GlobalSampler(Corpus(GPTConfig(d_model=64, n_layer=2), 60000, seed=1234).n_samples, seed=0)
    assert sorted(by_dp) == list(range(1, STEPS + 1))
    used = []
    for step in range(1, STEPS + 1):
        step_samples = [i for dp in sorted(by_dp[step]) for i in by_dp[step][dp]]
        assert sorted(step_samples) == sorted(sampler.next_global_batch(global_batch).tolist()), f"step {step}"
        used += step_samples
    assert len(used) == len(set(used))


@pytest.mark.parametrize("nproc, tp", [(2, 2), (2, 1)], ids=["tp2xdp2-to-tp2xdp1", "tp2xdp2-to-tp1xdp2"])
def test_resume_on_another_mesh_keeps_the_batch_and_the_trajectory(reference, tmp_path, nproc, tp):
    root = tmp_path / "switched"
    shutil.copytree(reference, root)
    for f in root.glob("metrics-*.jsonl"):
        f.unlink()
    # back to step 8, as if the 4-rank job had died after it; then the identical command on the new mesh
    assert ckpt_cli("rollback", root / "ckpt", "--to", "8", timeout=600).returncode == 0
    for f in root.glob("samples.rank*.jsonl"):  # the lost steps 9-12 of the first run are not "used"
        kept = [line for line in f.read_text().splitlines() if json.loads(line)["step"] <= 8]
        f.write_text("".join(line + "\n" for line in kept))
    metrics = launch(root, nproc, tp, "--dropout", "0")

    store = CheckpointStore(root / "ckpt")
    before, after = store.read_manifest(8), store.read_manifest(STEPS)
    assert after.layout.size("tp") == tp and after.world_size == nproc
    assert before.batch is not None and after.batch is not None
    assert after.batch.global_batch == before.batch.global_batch == 8 and after.batch.dp_size == nproc // tp
    [event] = [e for e in store.events() if e.event == "reshard"]
    assert event.data["batch"]["mesh"] == {"old": "dp_shard=2,tp=2", "new": after.layout.compact()}
    tp_peers_share_samples_and_each_is_used_once(root, 8)

    ref = {m.step: m for m in read_metrics(reference / "metrics-4x2.jsonl")}
    resumed = {m.step: m for m in read_metrics(metrics)}
    assert sorted(resumed) == list(range(9, STEPS + 1))
    worst = max(abs(resumed[s].loss - ref[s].loss) / abs(ref[s].loss) for s in resumed)
    worst_norm = max(abs(resumed[s].grad_norm - ref[s].grad_norm) / ref[s].grad_norm for s in resumed)
    print(f"{nproc} ranks tp {tp}: max relative difference after the mesh change: loss {worst:.3g}, grad norm {worst_norm:.3g}")
    assert worst < LOSS_TOLERANCE
    assert all(resumed[s].lr == ref[s].lr for s in resumed)  # the schedule is exact


def full_state(directory: Path) -> dict:
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return _load_state_dict_from_keys(checkpoint_id=str(directory))


def test_offline_reshard_between_meshes_copies_parameters_bit_for_bit(reference, tmp_path):
    out = tmp_path / "tp2x1"
    proc = ckpt_cli(
        "reshard", reference / "ckpt", "--world-size", "2", "--tp", "2", "--out", out, "--per-rank", "--json", timeout=600
    )  # the torchrun path (test_reshard.py tests the one-process copy)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["mesh"] == {"old": "dp_shard=2,tp=2", "new": "dp_shard=1,tp=2"}
    assert report["new"] == {"micro_batch": 2, "grad_accum": 4, "dp_size": 1, "global_batch": 8}
    store = CheckpointStore(out)
    m = store.read_manifest(STEPS)
    assert m.layout.dims == (("dp_shard", 1), ("tp", 2)) and m.layout.limits  # the model's limits travel with it
    assert store.check_files(STEPS).ok
    src, dst = full_state(reference / "ckpt" / "step_00000012"), full_state(out / "step_00000012")
    for part in ("model", "optim"):
        assert src[part].keys() == dst[part].keys()
        for k, v in src[part].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, dst[part][k]), k
    assert any(".attn.q." in k for k in src["model"])  # tensor-parallel parameters are among them

    # planning alone (no copy): tp 1 over 4 ranks; a tp size that does not divide the heads is refused
    plan = json.loads(ckpt_cli("reshard", reference / "ckpt", "--world-size", "4", "--tp", "1", "--json", timeout=600).stdout)
    assert plan["mesh"]["new"] == "dp_shard=4" and plan["new"]["global_batch"] == 8
    refused = ckpt_cli("reshard", reference / "ckpt", "--world-size", "3", "--tp", "3", timeout=600)
    assert refused.returncode == 4
    assert "tp 3 does not divide the attention heads (4)" in refused.stderr and "tp sizes that fit: 2 or 4" in refused.stderr
    uneven = ckpt_cli("reshard", reference / "ckpt", "--world-size", "3", timeout=600)  # tp 2 kept: 3 ranks cannot hold it
    assert uneven.returncode == 2 and "not a multiple of 2" in uneven.stderr and "nearest: 2 or 4" in uneven.stderr
    assert not (tmp_path / "never").exists()


def test_inspect_and_export_of_a_tensor_parallel_x_fsdp_checkpoint(reference, tmp_path):
    proc = ckpt_cli("inspect", reference / "ckpt", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["manifest"]["mesh_text"] == "dp_shard 2 x tp 2" and report["manifest"]["world_size"] == 4
    placements = {e["key"]: e["placement"] for e in report["entries"]}
    q = next(k for k in placements if k.startswith("model.") and ".attn.q.weight" in k)
    assert placements[q] not in ("whole", "dim 0 / 2") and "dim 0" in placements[q]  # split by both tp and fsdp
    pytest.importorskip("safetensors.torch")
    from safetensors.torch import load_file

    out = tmp_path / "tp.safetensors"
    proc = ckpt_cli("export", reference / "ckpt", "--model-only", "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stderr
    src = full_state(reference / "ckpt" / "step_00000012")
    got = load_file(out)
    assert got.keys() == {k for k, v in src["model"].items() if isinstance(v, torch.Tensor)}
    assert all(torch.equal(got[k], src["model"][k]) for k in got)


def test_a_nan_in_one_ranks_gradient_under_tp_x_fsdp_is_replayed_and_its_rank_named(reference, tmp_path):
    """#35 on the 2-D mesh (tp 2 x dp_shard 2, under `ckpt run`): a NaN in rank 3's gradient
    shard at step 6; the replay from step 4 names rank 3 alone (its tensor-parallel peer holds
    other shards), and the run ends on the uninterrupted run's trajectory, bit for bit."""
    job = RecipeJob(
        tmp_path, STEPS, SAVE_EVERY, (*BATCH, "--tp", "2", "--dropout", "0", "--corrupt-at-step", "6", "--corrupt-rank", "3"), nproc=4
    )
    assert job.run(timeout=600) == 0, job.log_tail()
    events = job.events()
    [verdict] = [e for e in events if e["event"] == "anomaly_replayed"]
    assert (verdict["verdict"], verdict["ranks"], verdict["differs_at"]) == ("transient", [3], 6), verdict
    assert [e["checkpoint"] for e in events if e["event"] == "resumed"] == [4]
    comparison = compare_runs(read_metrics(reference / "metrics-4x2.jsonl"), newest_per_step(read_metrics(job.metrics)))
    assert comparison.identical and comparison.steps_compared == STEPS, comparison.mismatches[:3]
