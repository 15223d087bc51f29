"""Figure 12: tensor parallel x FSDP. Save time of the TP recipe vs the FSDP-only recipe of the
same size, and resume time on a new mesh vs on the same mesh, in one run.

How: the reference recipe's model (``ckpt_tool.recipes.gpt_model``: d_model 384, 8 layers,
~15 M parameters; --quick 128 x 2) with AdamW state after one step, under ``torchrun`` (gloo, CPU).
Each launch times ``reps`` operations in one process, ranks synchronised by a barrier before and
after each, the slowest rank's time counted:

* save: ``CheckpointManager.save(step)`` (sync: probe, DCP write with hashing, commit), on a
  4-rank FSDP-only mesh (dp_shard 4) and on a 4-rank tp 2 x dp_shard 2 mesh; two launches each,
  in the order FSDP, TP, TP, FSDP;
* resume: a fresh model, optimizer and ``CheckpointManager.resume()`` (checks, hash-checked DCP
  load, per-rank state, probe re-measured) of the tp 2 x dp 2 checkpoint, on the same mesh
  (4 ranks) and on two new meshes: tp 1 x dp 4 (4 ranks) and tp 2 x dp 1 (2 ranks, each rank
  reads twice the share).

The page cache is warm (the files were just written): this compares the work of resharding, not
the disk.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats

HERE = Path(__file__).resolve()


# ----------------------------------------------------------------------------- worker (one rank)
def worker(mode: str, directory: Path, tp: int, reps: int, d_model: int, n_layer: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from ckpt_tool import BatchRequest, CheckpointConfig, CheckpointManager, ProbeSpec, clip_grad_norm, init_distributed
    from ckpt_tool.recipes import tiny_gpt
    from ckpt_tool.recipes.data import Corpus, probe_batch
    from ckpt_tool.recipes.gpt_model import GPTConfig, lm_loss
    from ckpt_tool.training.mesh import init_dp_tp_mesh

    init_distributed("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = GPTConfig(d_model=d_model, n_layer=n_layer, dropout=0.0)
    corpus = Corpus(c, 20_000, seed=1234)
    dm = init_dp_tp_mesh(world, tp)

    def manager() -> Any:
        model = tiny_gpt.build_model(c, 0, dm)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return CheckpointManager(
            CheckpointConfig(directory, save_every=0),
            model=model,
            optimizer=optimizer,
            probe=ProbeSpec(probe_batch(corpus), lm_loss),
            batch=BatchRequest(global_batch=8),
            mesh=dm,
            must_divide={"tp": c.tp_limits()},
        )

    def timed(fn: Any) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        seconds = torch.tensor(time.perf_counter() - t0, dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return float(seconds)

    times = []
    if mode == "save":
        mgr = manager()
        loss = lm_loss(mgr.model, corpus.batch(torch.arange(2)))  # one step: AdamW has its state
        loss.backward()
        clip_grad_norm(mgr.model.parameters(), 1.0)
        mgr.optimizer.step()
        mgr.optimizer.zero_grad(set_to_none=True)
        start = (mgr.resume() or 0) + 1
        for step in range(start, start + reps):
            times.append(timed(lambda s=step: mgr.save(s)))
        mgr.close(final=False)
    else:
        for _ in range(reps):
            mgr = manager()
            times.append(timed(mgr.resume))
            mgr.close(final=False)
    if rank == 0:
        params = sum(p.numel() for p in tiny_gpt.build_model(c, 0).parameters())
        out.write_text(json.dumps({"times": times, "params": params}))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver
def launch(mode: str, directory: Path, nproc: int, tp: int, reps: int, size: tuple[int, int], work: Path) -> dict[str, Any]:
    out = work / f"{mode}-{nproc}x{tp}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(HERE), "--worker", mode]
    cmd += [str(directory), str(tp), str(reps), str(size[0]), str(size[1]), str(out)]
    seconds, proc = common.time_command(cmd, timeout_s=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {(proc.stdout or '')[-3000:]}{(proc.stderr or '')[-3000:]}")
    common.log(f"{mode} on {nproc} ranks, tp {tp}: {seconds:.1f} s")
    return json.loads(out.read_text())


def measure(work: Path, reps: int, size: tuple[int, int]) -> tuple[dict[str, list[float]], int, int]:
    fsdp, tp = work / "fsdp", work / "tp"
    times: dict[str, list[float]] = {}
    params = 0
    for directory, t in ((fsdp, 1), (tp, 2), (tp, 2), (fsdp, 1)):
        result = launch("save", directory, 4, t, reps, size, work)
        times.setdefault(f"save_tp{t}", []).extend(result["times"])
        params = result["params"]
    from ckpt_tool.store.store import CheckpointStore

    store = CheckpointStore(tp)
    nbytes = store.read_manifest(store.read_latest()).total_bytes
    for name, nproc, t in (("resume_same", 4, 2), ("resume_tp1x4", 4, 1), ("resume_tp2x1", 2, 2), ("resume_same", 4, 2)):
        times.setdefault(name, []).extend(launch("resume", tp, nproc, t, reps, size, work)["times"])
    return times, params, nbytes


def report(times: dict[str, list[float]], params: int, nbytes: int) -> Result:
    s = {k: Stats.of(v) for k, v in times.items()}
    result = Result("12", f"Tensor parallel x FSDP: save and resume across meshes ({params / 1e6:.1f} M parameters, {nbytes / 1e6:.0f} MB)")
    fsdp, tp = s["save_tp1"], s["save_tp2"]
    result.rows.append(
        Row(
            "save (sync), tp 2 x dp_shard 2, 4 ranks (info)",
            tp.fmt(3, "s"),
            f"FSDP only, dp_shard 4, 4 ranks: {fsdp.fmt(3, 's')}",
            round(tp.median / fsdp.median, 3),
        )
    )
    same = s["resume_same"]
    for key, label in (("resume_tp1x4", "tp 1 x dp_shard 4, 4 ranks"), ("resume_tp2x1", "tp 2 x dp_shard 1, 2 ranks")):
        result.rows.append(
            Row(
                f"resume() of the tp 2 x dp 2 checkpoint on a new mesh: {label} (info)",
                s[key].fmt(3, "s"),
                f"same mesh, 4 ranks: {same.fmt(3, 's')}",
                round(s[key].median / same.median, 3),
            )
        )
    result.notes.append(
        "every resume hash-checks every file it reads and re-measures the probe; on a new mesh DCP reads the overlapping "
        "pieces of each saved shard (and the per-rank state is taken by mesh coordinates)"
    )
    result.notes.append(
        "the saves and the same-mesh resume: two launches each, each new mesh one launch (n above); slowest rank; warm page cache"
    )
    cores = os.cpu_count() or 1
    if cores < 4:
        result.notes.append(
            f"this machine has {cores} cores: 4 ranks oversubscribe them (a resume is CPU-bound here), so the 2-rank row "
            "compares rank counts as much as meshes"
        )
    result.details = {"seconds": times, "medians": {k: statistics.median(v) for k, v in times.items()}}
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, directory, tp, reps, d_model, n_layer, out = sys.argv[2:9]
        worker(mode, Path(directory), int(tp), int(reps), int(d_model), int(n_layer), Path(out))
        return
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="timed operations per launch (default 4; --quick 2)")
    args = parser.parse_args()
    reps = args.reps or (2 if args.quick else 4)
    size = (128, 2) if args.quick else (384, 8)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with common.scratch_dir(args.work_dir, "tensor_parallel") as work:
        times, params, nbytes = measure(work, reps, size)
    report(times, params, nbytes).emit()


if __name__ == "__main__":
    main()
