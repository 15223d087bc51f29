"""Reference recipe: a small GPT trained with FSDP2 (CPU or CUDA), optionally tensor parallel x FSDP.

    torchrun --standalone --nproc-per-node 4 -m ckpt_tool.recipes.tiny_gpt \\
        --ckpt-dir DIR --steps 40 --save-every 10 --metrics metrics.jsonl [--tp 2]

The model (``gpt_model``: embeddings, causal attention with dropout, MLP, layer norm) is laid
out on a ``(dp_shard, tp)`` device mesh: attention and MLP tensor parallel over ``tp``, FSDP2
over ``dp_shard``. AdamW, linear warm-up + cosine LR, gradient clipping, gradient accumulation;
a shuffled stream over a deterministic corpus (``data``), partitioned by data-parallel rank. One
JSON line per optimizer step goes to ``--metrics`` (loss with full float precision), appended
across restarts; the run resumes from the newest valid checkpoint in ``--ckpt-dir``, on any mesh
the checkpoint fits (the global batch is kept). ``--device cpu|cuda|auto`` (``recipes.device``):
on CUDA each rank takes the GPU of its ``LOCAL_RANK`` and the collectives go over NCCL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from ckpt_tool.core.anomaly import AnomalyPolicy
from ckpt_tool.core.batch import BatchRequest
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import RESTART_CANNOT_HELP, CkptError, ExitCode
from ckpt_tool.recipes import device as devices
from ckpt_tool.recipes.data import Corpus, GlobalSampler, micro_batch_indices, probe_batch
from ckpt_tool.recipes.faults import (
    add_wrong_number_options,
    before_commit_hook,
    corrupt_gradient_once,
    crash_now,
    hang_once,
    next_faulty_node,
    node_fault,
    poison,
    skew_replica_once,
    slow_compute,
    stall_once,
)
from ckpt_tool.recipes.gpt_model import GPTConfig, TinyGPT, lm_loss, shard_model
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.distributed import init_distributed
from ckpt_tool.training.grad_norm import clip_grad_norm, local_norm
from ckpt_tool.training.heartbeat import heartbeat
from ckpt_tool.training.manager import CheckpointManager
from ckpt_tool.training.mesh import init_dp_tp_mesh, run_mesh
from ckpt_tool.training.probe import ProbeSpec

ENTRY_POINT = "ckpt_tool.recipes.tiny_gpt:build_for_verify"


# ----------------------------------------------------------------------------- building blocks
def lr_lambda(warmup: int, total: int):
    """The ``LambdaLR`` factor at a step: linear warm-up over ``warmup`` steps to 1, then cosine down to 0.1 at
    ``total``, staying there after."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def build_model(c: GPTConfig, seed: int, mesh: DeviceMesh | None = None, device: torch.device | str = "cpu") -> nn.Module:
    """The same initial weights on every rank and device (made on the CPU, then moved to
    ``device``), then laid out on ``mesh`` (tensor parallel, FSDP2)."""
    torch.manual_seed(seed)
    model = TinyGPT(c).to(device)
    return shard_model(model, mesh) if mesh is not None else model


def build_for_verify(world_size: int = 1, mesh: DeviceMesh | None = None, **config: Any) -> tuple[nn.Module, Any]:
    """Entry point for ``ckpt verify``: the model (any weights: they are loaded) and the probe loss.

    ``config`` is what the run recorded in the manifest (``entry_kwargs``); laid out on ``mesh``
    (``ckpt verify --nproc N --tp T`` passes a ``(dp_shard, tp)`` mesh).
    """
    return build_model(GPTConfig(**config), seed=0, mesh=mesh), lm_loss


# ----------------------------------------------------------------------------- main
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad arguments are a configuration error: tell `ckpt run` (no restart), then exit 2."""
        heartbeat().fatal(ExitCode.USAGE, f"{self.prog}: {message}")
        super().error(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The recipe's arguments, fault injection and test hooks included (``--ckpt-dir`` defaults to
    ``$CKPT_DIR``); ``--device`` is resolved to a device type here: ``--device cuda`` without CUDA exits 2."""
    p = _Parser(prog="python -m ckpt_tool.recipes.tiny_gpt", description=__doc__.split("\n\n")[0])
    exported = os.environ.get("CKPT_DIR")  # set by `ckpt run --ckpt-dir` and `ckpt submit`
    p.add_argument("--ckpt-dir", type=Path, required=not exported, default=Path(exported) if exported else None, help="default: $CKPT_DIR")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--metrics", type=Path, required=True)
    p.add_argument("--async-save", action="store_true")
    devices.add_device_option(p)
    p.add_argument("--local-every", type=int, default=0, help="fast tier: save to node-local storage every K steps (0: off)")
    p.add_argument(
        "--local-dir", type=Path, help="fast tier directory (default /dev/shm/ckpt-USER-JOB; $CKPT_LOCAL_DIR overrides per node)"
    )
    p.add_argument("--local-replicas", type=int, default=1, help="fast tier: copies kept on other nodes")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (attention and MLP); data parallel takes the other ranks")
    p.add_argument(
        "--replicate", type=int, default=1, help="HSDP: this many replicas, each sharding the model over the other data-parallel ranks"
    )
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--global-batch", type=int)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument(
        "--crash-at-step",
        type=int,
        action="append",
        default=[],
        help="rank 0 dies with SIGKILL at the start of this step, once (repeatable)",
    )
    p.add_argument("--crash-repeat", action="store_true", help="test hook: crash at --crash-at-step on every attempt (a crash loop)")
    p.add_argument(
        "--fail-on-node",
        help="fault injection: the ranks on this SLURM node fail --fail-after-steps steps into every start (a lasting fault); "
        "A,B,C: one fault on each, in order (a fault that moves)",
    )
    p.add_argument("--fail-after-steps", type=int, default=2, help="with --fail-on-node: steps into each start before the fault")
    p.add_argument(
        "--fail-from-restart",
        type=int,
        default=0,
        help="with --fail-on-node: the fault begins at this SLURM requeue count (SLURM_RESTART_COUNT)",
    )
    p.add_argument("--bug-at-step", type=int, help="fault injection: every rank raises at this step, every time (a bug in the code)")
    p.add_argument("--data-stall-at-step", type=int, help="test hook: the data loader stalls at this step, once")
    p.add_argument("--data-stall-s", type=float, default=20.0)
    p.add_argument("--hang-at-step", type=int, help="fault injection: --hang-rank loops forever in Python at this step, once")
    p.add_argument("--hang-rank", type=int, default=0, help="with --hang-at-step: the rank that hangs")
    p.add_argument("--slow-rank", type=int, help="fault injection: this rank computes --slow-ms longer every step (a straggler)")
    p.add_argument("--slow-ms", type=float, default=0.0, help="with --slow-rank: extra compute per step, in ms (CPU kept busy)")
    p.add_argument("--slow-from-step", type=int, default=1, help="with --slow-rank: the first slow step")
    add_wrong_number_options(p)
    p.add_argument("--log-samples", type=Path, help="test hook: each rank appends the sample indices of every step to PATH.rankR.jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--d-model", type=int, default=GPTConfig.d_model)
    p.add_argument("--n-layer", type=int, default=GPTConfig.n_layer)
    p.add_argument("--seq-len", type=int, default=GPTConfig.seq_len)
    p.add_argument("--corpus-tokens", type=int, default=200_000)
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--keep-every", type=int)
    p.add_argument("--max-failed-saves", type=int, default=3, help="failed saves in a row that stop the run with exit code 78 (0: never)")
    p.add_argument("--save-delay", type=float, default=0.0, help="test hook: seconds of extra delay between writing and committing a save")
    p.add_argument(
        "--crash-in-save-at", type=int, help="rank 0 dies with SIGKILL inside this step's save, its files written but not committed, once"
    )
    p.add_argument(
        "--save-delay-at", type=int, action="append", default=[], help="with --save-delay: delay only the saves of these steps (repeatable)"
    )
    args = p.parse_args(argv)
    devices.resolve(p, args)  # --device cuda without CUDA: exit 2 here, before anything starts
    return args


def main(argv: list[str] | None = None) -> int:
    """One rank of the recipe under torchrun: returns 0 when the training finished, else a ``CkptError``'s exit
    code (message and hint on stderr; a code a restart cannot fix is also told to the watchdog as fatal)."""
    args = parse_args(argv)
    devices.bind(args.device)
    init_distributed(devices.backend(args.device))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        return train(args, rank, world)
    except CkptError as exc:  # keep its exit code: 2 and 4 are not restarted by `ckpt run`
        print(f"rank {rank}: error: {exc.message}\n  hint: {exc.hint}", file=sys.stderr)
        if exc.exit_code in RESTART_CANNOT_HELP:
            heartbeat().fatal(exc.exit_code, str(exc))
        return exc.exit_code
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, world: int) -> int:
    """Train from the newest valid checkpoint (or step 0) to ``--steps`` on the ``(dp_shard, tp)`` mesh, keeping
    the checkpoint's global batch; returns 0. Raises ``CkptError`` (no batch configuration, a mesh that does not
    fit, the checkpoint manager's errors) and the injected faults' errors."""
    c = GPTConfig(seq_len=args.seq_len, d_model=args.d_model, n_layer=args.n_layer, dropout=args.dropout)
    # On a resume the checkpoint's global batch wins (the same command runs on any allowed mesh);
    # --global-batch given explicitly and different changes it on purpose.
    requested = BatchRequest(args.micro_batch, args.grad_accum, args.global_batch)
    corpus = Corpus(c, args.corpus_tokens, seed=1234)
    device = devices.bind(args.device)
    dm = init_dp_tp_mesh(world, args.tp, device.type, args.replicate)
    # checked before the model is split (--tp 3 with 4 heads is refused with the sizes that fit)
    mesh = run_mesh(dm, world, {"tp": c.tp_limits()})
    model = build_model(c, args.seed, dm, device)
    dp_rank = mesh.dp_rank(rank)
    # One RNG stream per data-parallel rank (dropout), restored from the checkpoint on resume:
    # tensor-parallel peers draw the same masks, so replicated activations stay equal across them.
    torch.manual_seed(args.seed * 7919 + 17 * dp_rank + 1)
    random.seed(args.seed + dp_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.warmup, args.steps))
    sampler = GlobalSampler(corpus.n_samples, args.seed)
    manager = CheckpointManager(
        CheckpointConfig(
            args.ckpt_dir,
            save_every=args.save_every,
            async_save=args.async_save,
            local_every=args.local_every,
            local_dir=args.local_dir,
            local_replicas=args.local_replicas,
            retention=RetentionPolicy(args.keep_last, args.keep_every),
            max_failed_saves=args.max_failed_saves,
            anomaly=AnomalyPolicy(mode=args.anomaly, window=args.anomaly_window),
            replica_check_every=args.replica_check_every,
            audit_every=args.audit_every,
            entry_point=ENTRY_POINT,
            entry_kwargs={"seq_len": c.seq_len, "d_model": c.d_model, "n_layer": c.n_layer, "n_head": c.n_head, "vocab": c.vocab},
        ),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=sampler,
        probe=ProbeSpec(probe_batch(corpus), lm_loss),
        batch=requested,
        mesh=dm,
        must_divide={"tp": c.tp_limits()},
        before_commit=before_commit_hook(args, rank),
    )
    start = manager.resume() or 0
    batch = manager.batch  # after a resume at another world size: the reshard plan (same global batch)
    if batch is None:
        raise CkptError("no batch configuration", "pass --global-batch or --micro-batch")
    fault_node = next_faulty_node(args)  # decided before any rank can fail in this attempt
    samples_log = open(f"{args.log_samples}.rank{rank}.jsonl", "a") if args.log_samples else None
    hb = heartbeat()
    counters = {"samples": 0, "tokens": 0, **manager.extra}
    metrics = open(args.metrics, "a", encoding="utf-8") if rank == 0 else None
    try:
        for step in range(start + 1, args.steps + 1):
            if rank == 0 and step in args.crash_at_step:
                crash_now(args.ckpt_dir, step, args.crash_repeat)
            if step == args.bug_at_step:
                raise ValueError(f"injected bug at step {step} (--bug-at-step): every rank fails here, on every node")
            if fault_node is not None and step == start + args.fail_after_steps:
                node_fault(args.ckpt_dir, fault_node)
            with hb.phase("data"):
                if step == args.data_stall_at_step and rank == 0:  # one rank's loader stalls
                    stall_once(args.ckpt_dir, step, args.data_stall_s)
                global_batch = sampler.next_global_batch(batch.global_batch)
                indices = [micro_batch_indices(global_batch, batch, dp_rank, m) for m in range(batch.grad_accum)]
                micro_batches = [devices.to_device(corpus.batch(i), device) for i in indices]
            if samples_log is not None:  # test hook: which samples each rank used at each step
                samples_log.write(
                    json.dumps(
                        {"step": step, "rank": rank, "dp_rank": dp_rank, "resumed_from": start, "indices": torch.cat(indices).tolist()}
                    )
                    + "\n"
                )
                samples_log.flush()
            if step == args.hang_at_step and rank == args.hang_rank:
                hang_once(args.ckpt_dir, step)
            if rank == args.slow_rank and step >= args.slow_from_step:
                slow_compute(args.slow_ms / 1000)
            loss_sum = torch.zeros((), device=device)
            for data in micro_batches:
                loss = poison(args, lm_loss(model, data) / batch.grad_accum, rank, step)
                loss.backward()
                loss_sum += loss.detach()
            corrupt_gradient_once(args, model, rank, step)
            # this rank's own values, for the checkpoint manager's checks: its loss before the
            # all-reduce, the norm of its gradient shards (a wrong value on one rank is its own)
            own = {"loss": float(loss_sum), "grad_norm": float(local_norm(p.grad for p in model.parameters() if p.grad is not None))}
            grad_norm = clip_grad_norm(model.parameters(), 1.0)  # parameters on two meshes under tensor parallel
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            skew_replica_once(args, model, rank, world, step)
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            dist.all_reduce(loss_sum)
            counters["samples"] += batch.global_batch
            counters["tokens"] += batch.global_batch * c.seq_len
            if metrics is not None:
                # json writes floats with repr: full precision, exact round-trip
                line = {"step": step, "loss": float(loss_sum) / world, "lr": float(lr), "grad_norm": float(grad_norm)}
                metrics.write(json.dumps(line) + "\n")
                metrics.flush()
            manager.maybe_save(step, extra=counters, metrics=own)
        manager.close()
    finally:
        if metrics is not None:
            metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
