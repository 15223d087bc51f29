"""Figure 14: the fast tier (#17). Training blocked per local save vs per shared save, in the same
run; steps lost per failure with and without the fast tier at the same overhead budget (from those
figures); resume() from the rank's own local copy, from a peer's copy (node replaced) and from the
shared tier.

How: two torchrun agents on this machine stand for two nodes (1 rank each, static rendezvous,
gloo, CPU; each with its own CKPT_LOCAL_DIR under the work directory, on the same disk as the
shared directory: /dev/shm by default, the product's default, --local-root to change it). The reference recipe's model
(d_model 384, 8 layers, FSDP2 over the 2 ranks, AdamW; --quick 128 x 2). One launch trains
``steps`` steps with an async shared save every 4 steps and a local save at every other step,
timing each training step alone and each save's blocking part: ``maybe_save`` plus the wait for
its copy to CPU memory (what the next optimizer step waits for), slowest rank. Then launches
that each time one ``resume()`` (a fresh model and manager; hash checks as always) after the
driver removed: nothing (own local copies), node 0's local directory (rank 0's files come from
rank 1's copy), both (the shared tier serves).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats

HERE = Path(__file__).resolve()
SHARED_EVERY = 4
BUDGET = 0.05  # the overhead budget the steps-lost rows compare at


# ----------------------------------------------------------------------------- worker (one rank)
def worker(mode: str, directory: Path, steps: int, d_model: int, n_layer: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from ckpt_tool import BatchRequest, CheckpointConfig, CheckpointManager, init_distributed
    from ckpt_tool.recipes import tiny_gpt
    from ckpt_tool.recipes.data import Corpus
    from ckpt_tool.recipes.gpt_model import GPTConfig, lm_loss
    from ckpt_tool.training.mesh import init_dp_tp_mesh

    init_distributed("gloo")
    c = GPTConfig(d_model=d_model, n_layer=n_layer, dropout=0.0)
    corpus = Corpus(c, 20_000, seed=1234)
    dm = init_dp_tp_mesh(dist.get_world_size(), 1)
    model = tiny_gpt.build_model(c, 0, dm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = CheckpointConfig(directory, save_every=SHARED_EVERY, async_save=True, local_every=2, save_final=False)
    mgr = CheckpointManager(config, model=model, optimizer=optimizer, batch=BatchRequest(global_batch=8), mesh=dm)

    def slowest(seconds: float) -> float:
        t = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    record: dict[str, Any] = {"train": [], "local": [], "shared": []}
    if mode == "save":
        for step in range(1, steps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            loss = lm_loss(model, corpus.batch(torch.arange(8) + 8 * step))
            loss.backward()
            optimizer.step()  # its pre-hook waits for the copy of the save before
            optimizer.zero_grad(set_to_none=True)
            record["train"].append(slowest(time.perf_counter() - t0))
            dist.barrier()
            t0 = time.perf_counter()
            mgr.maybe_save(step)
            mgr.wait_for_staging()
            blocked = slowest(time.perf_counter() - t0)
            if step % SHARED_EVERY == 0:
                record["shared"].append(blocked)
            elif step % 2 == 0:
                record["local"].append(blocked)
        mgr.wait()
        record["state_bytes"] = sum(p.numel() * p.element_size() for p in tiny_gpt.build_model(c, 0).parameters()) * 3
    else:
        dist.barrier()
        t0 = time.perf_counter()
        record["step"] = mgr.resume()
        record["resume"] = slowest(time.perf_counter() - t0)
    mgr.close(final=False)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(record))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver
def launch(mode: str, work: Path, steps: int, size: tuple[int, int], local_root: Path) -> dict[str, Any]:
    from ckpt_tool.recipes.launch import node_command

    out = work / f"{mode}-{time.monotonic_ns()}.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    args = [str(HERE), "--worker", mode, str(work / "ckpt"), str(steps), str(size[0]), str(size[1]), str(out)]
    procs = []
    t0 = time.monotonic()
    for node in range(2):
        cmd = node_command(node, 2, 1, endpoint, [])[:-2] + args  # the bench's own worker, not the recipe
        env = {**os.environ, "CKPT_LOCAL_DIR": str(local_root / f"node{node}")}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{mode} launch failed: {outputs[0][-3000:]}\n{outputs[1][-3000:]}")
    common.log(f"{mode}: {time.monotonic() - t0:.1f} s")
    return json.loads(out.read_text())


def measure(work: Path, steps: int, size: tuple[int, int], local_root: Path, reps: int) -> dict[str, Any]:
    saved = launch("save", work, steps, size, local_root)
    resumes: dict[str, list[float]] = {"own": [], "peer": [], "shared": []}
    steps_from: dict[str, set[int]] = {k: set() for k in resumes}
    backup = work / "local-backup"
    shutil.copytree(local_root, backup)
    for _ in range(reps):
        for kind, remove in (("own", ()), ("peer", ("node0",)), ("shared", ("node0", "node1"))):
            shutil.rmtree(local_root)
            shutil.copytree(backup, local_root)
            for name in remove:
                shutil.rmtree(local_root / name)
            r = launch("resume", work, steps, size, local_root)
            resumes[kind].append(r["resume"])
            steps_from[kind].add(r["step"])
    return {"save": saved, "resume": resumes, "steps": {k: sorted(v) for k, v in steps_from.items()}}


def report(m: dict[str, Any], local_root: Path, fs: str) -> Result:
    saved = m["save"]
    train, local, shared = Stats.of(saved["train"][1:]), Stats.of(saved["local"]), Stats.of(saved["shared"])
    result = Result(
        "14",
        f"The fast tier: node-local saves with a peer copy vs the shared tier ({saved['state_bytes'] / 1e6:.0f} MB of state, 2 nodes x 1 rank)",
    )
    result.rows.append(
        Row(
            "training blocked per local save (info)",
            local.fmt(3, "s"),
            f"per shared (async) save: {shared.fmt(3, 's')}",
            round(local.median / shared.median, 3),
        )
    )
    for name, blocked in (("shared tier alone", shared), ("fast tier", local)):
        interval = blocked.median / BUDGET  # seconds of training between saves that keep blocking at the budget
        result.rows.append(
            Row(
                f"work lost per failure at a {BUDGET:.0%} overhead budget, {name} (info)",
                f"{interval / 2:.2f} s = {interval / 2 / train.median:.2f} steps (a save every {interval:.2f} s)",
                f"step {train.fmt(3, 's')}",
                None,
            )
        )
    shared_r = Stats.of(m["resume"]["shared"])
    for kind, label in (("peer", "a peer's copy (node 0 replaced)"), ("own", "the rank's own local copy")):
        r = Stats.of(m["resume"][kind])
        result.rows.append(
            Row(
                f"resume() from {label} (info)",
                r.fmt(3, "s"),
                f"from the shared tier: {shared_r.fmt(3, 's')}",
                round(r.median / shared_r.median, 3),
            )
        )
    result.notes.append(
        f"resumed steps: own {m['steps']['own']}, peer {m['steps']['peer']}, shared {m['steps']['shared']} "
        f"(shared saves every {SHARED_EVERY} steps, local every 2); local directories under {local_root} ({fs})"
    )
    result.notes.append(
        "work lost: the interval that keeps the blocked time at the budget (blocked / budget), half of it lost on average per "
        "failure (a model from the measured blocked times; on this machine the interval is below one step, so every step could "
        "be saved). With the fast tier, the failure of any one node is recovered from the local tier, and the shared tier's "
        "interval is set by the rarer failures that take more than one node"
    )
    result.details = {"save": saved, "resume": m["resume"], "medians": {k: statistics.median(v) for k, v in m["resume"].items()}}
    return result


def common_fs(path: Path) -> str:
    found = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True).stdout.splitlines()
    return found[-1].split()[1] if len(found) > 1 else "?"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, directory, steps, d_model, n_layer, out = sys.argv[2:8]
        worker(mode, Path(directory), int(steps), int(d_model), int(n_layer), Path(out))
        return
    parser = common.base_parser(__doc__)
    parser.add_argument(
        "--local-root",
        type=Path,
        help="where the two nodes' local directories go (default: /dev/shm, the product's default, else the work directory)",
    )
    args = parser.parse_args()
    size = (128, 2) if args.quick else (384, 8)
    steps = 14 if args.quick else 22  # the last step a local one, newer than the last shared (every 4)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with common.scratch_dir(args.work_dir, "local_tier") as work:
        shm = Path("/dev/shm")
        local_root = (args.local_root or (shm if shm.is_dir() and os.access(shm, os.W_OK) else work)) / f"ckpt-bench-local-{os.getpid()}"
        local_root.mkdir(parents=True, exist_ok=True)
        fs = f"{common_fs(local_root)}; the shared tier on {common_fs(work)}"
        try:
            m = measure(work, steps, size, local_root, reps=1 if args.quick else 2)
        finally:
            shutil.rmtree(local_root, ignore_errors=True)
    report(m, local_root, fs).emit()


if __name__ == "__main__":
    main()
