"""Second reference recipe: a small conv net with BatchNorm and dropout on generated images.

    torchrun --standalone --nproc-per-node 2 -m ckpt_tool.recipes.tiny_cnn \\
        --ckpt-dir DIR --steps 30 --save-every 5 --metrics metrics.jsonl [--amp] [--async-save]
    python -m ckpt_tool.recipes.tiny_cnn ...            # one process, no torch.distributed

Another family than the GPT recipe, as a script written from the README's Quick start: DDP
(``DistributedDataParallel`` over gloo, buffers broadcast from rank 0 at each forward), SGD with
momentum and weight decay, ``OneCycleLR``, optional fp16 autocast with ``torch.amp.GradScaler``
(started high, growing every 4 steps: it skips steps on overflow, and its scale is state), the
project's ``GlobalSampler`` (``state_dict()``), images generated from each sample's index. One
JSON line per optimizer step goes to ``--metrics``: loss, eval loss (a fixed batch, eval mode:
it reads the BatchNorm running statistics), LR, gradient norm, the scaler's scale.
``--device cpu|cuda|auto`` (``recipes.device``): on CUDA, DDP over NCCL on each rank's GPU, and
``--amp`` autocasts on CUDA (``--amp-dtype fp16`` with the GradScaler, ``bf16`` without: bf16
has fp32's range, nothing to scale).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ckpt_tool.core.anomaly import AnomalyPolicy
from ckpt_tool.core.batch import BatchRequest
from ckpt_tool.errors import CkptError
from ckpt_tool.recipes import device as devices
from ckpt_tool.recipes.data import GlobalSampler, micro_batch_indices
from ckpt_tool.recipes.faults import (
    add_wrong_number_options,
    before_commit_hook,
    corrupt_gradient_once,
    crash_now,
    poison,
    skew_replica_once,
)
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.grad_norm import local_norm
from ckpt_tool.training.manager import CheckpointManager
from ckpt_tool.training.probe import ProbeSpec

ENTRY_POINT = "ckpt_tool.recipes.tiny_cnn:build_for_verify"
CLASSES, SIZE = 10, 12


class TinyCNN(nn.Module):
    """Two conv + BatchNorm + ReLU layers (the second with stride 2), global average pooling, dropout and a
    linear head over ``CLASSES``; BatchNorm's running statistics are part of its state."""

    def __init__(self, width: int = 8, dropout: float = 0.1) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images of shape ``(batch, 3, H, W)`` to logits of shape ``(batch, CLASSES)``."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(self.drop(x.mean(dim=(2, 3))))


def images(indices: torch.Tensor, seed: int = 1234) -> dict[str, torch.Tensor]:
    """Sample i: class i % 10, its class's pattern plus noise drawn from i alone (any order, any rank)."""
    patterns = torch.randn(CLASSES, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))
    xs = [
        patterns[int(i) % CLASSES] + 0.8 * torch.randn(3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed + 7 * int(i) + 1))
        for i in indices
    ]
    return {"x": torch.stack(xs), "y": indices % CLASSES}


def ce_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The batch is moved to the model's device (the probe's is stored on the CPU)."""
    device = devices.device_of(model)
    return F.cross_entropy(model(batch["x"].to(device)), batch["y"].to(device))


def build_for_verify(world_size: int = 1, mesh: Any = None, **config: Any) -> tuple[nn.Module, Any]:
    """Entry point for ``ckpt verify``: the model (its weights and buffers are loaded) and the probe loss."""
    return TinyCNN(**config), ce_loss


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The recipe's arguments (``--ckpt-dir`` defaults to ``$CKPT_DIR``); ``--device`` is resolved to a device
    type here, so ``--device cuda`` without CUDA exits 2 before anything starts."""
    p = argparse.ArgumentParser(prog="python -m ckpt_tool.recipes.tiny_cnn", description=__doc__.split("\n\n")[0])
    exported = os.environ.get("CKPT_DIR")
    p.add_argument("--ckpt-dir", type=Path, required=not exported, default=Path(exported) if exported else None)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--metrics", type=Path, required=True)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--amp", action="store_true", help="autocast (--amp-dtype) on the run's device; fp16 with a GradScaler")
    p.add_argument("--amp-dtype", choices=("fp16", "bf16"), default="fp16", help="with --amp: fp16 (and a GradScaler) or bf16")
    devices.add_device_option(p)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--global-batch", type=int)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--crash-at-step", type=int, action="append", default=[], help="rank 0 dies with SIGKILL at the start of this step, once"
    )
    p.add_argument("--no-probe", action="store_true", help="save without a probe batch (a script that gives none)")
    p.add_argument(
        "--crash-in-save-at", type=int, help="rank 0 dies with SIGKILL inside this step's save, its files written but not committed, once"
    )
    add_wrong_number_options(p)
    args = p.parse_args(argv)
    devices.resolve(p, args)  # --device cuda without CUDA: exit 2 here, before anything starts
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the recipe: under torchrun (``RANK`` set) as one rank of a process group, else as a single process.
    Returns 0 when the training finished, a ``CkptError``'s exit code (message and hint on stderr) otherwise."""
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    devices.bind(args.device)
    if distributed:
        from ckpt_tool.training.distributed import init_distributed

        init_distributed(devices.backend(args.device))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    try:
        return train(args, rank, world, distributed)
    except CkptError as exc:
        print(f"error: {exc.message}\nhint: {exc.hint}", file=sys.stderr)
        return int(exc.exit_code)
    finally:
        if distributed and dist.is_initialized():
            dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, world: int, distributed: bool) -> int:
    """Train from the newest valid checkpoint (or step 0) to ``--steps``, appending one metrics line per step on
    rank 0 and saving every ``--save-every`` steps; returns 0. Raises ``CkptError`` from the checkpoint manager."""
    # a step the scaler skipped (an overflow) leaves the optimizer unstepped: the schedule still advances
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
    device = devices.bind(args.device)
    torch.manual_seed(args.seed)
    net = TinyCNN(args.width, args.dropout).to(device)  # made on the CPU: the same weights on either device
    on_cuda = device.type == "cuda"
    model: nn.Module = DistributedDataParallel(net, device_ids=[device.index] if on_cuda else None) if distributed else net
    torch.manual_seed(args.seed * 7919 + 17 * rank + 1)  # one dropout stream per rank, restored on resume
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps)
    amp_dtype = torch.float16 if args.amp_dtype == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**20, growth_interval=4, enabled=args.amp and amp_dtype == torch.float16)
    sampler = GlobalSampler(args.samples, args.seed)

    manager = CheckpointManager(
        CheckpointConfig(
            args.ckpt_dir,
            save_every=args.save_every,
            async_save=args.async_save,
            anomaly=AnomalyPolicy(mode=args.anomaly, window=args.anomaly_window),
            replica_check_every=args.replica_check_every,
            audit_every=args.audit_every,
            entry_point=ENTRY_POINT,
            entry_kwargs={"width": args.width, "dropout": args.dropout},
        ),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        data=sampler,
        probe=None if args.no_probe else ProbeSpec(images(torch.arange(8)), ce_loss),
        batch=BatchRequest(args.micro_batch, args.grad_accum, args.global_batch),
        before_commit=before_commit_hook(args, rank),
    )
    start = manager.resume() or 0
    batch = manager.batch
    assert batch is not None
    evaluation = devices.to_device(images(torch.arange(10_000, 10_032)), device)
    metrics = open(args.metrics, "a", encoding="utf-8") if rank == 0 else None
    try:
        for step in range(start + 1, args.steps + 1):
            if rank == 0 and step in args.crash_at_step:
                crash_now(args.ckpt_dir, step)
            global_batch = sampler.next_global_batch(batch.global_batch)
            loss_sum = torch.zeros((), device=device)
            for m in range(batch.grad_accum):
                data = devices.to_device(images(micro_batch_indices(global_batch, batch, rank, m)), device)
                last = m == batch.grad_accum - 1
                sync = model.no_sync() if distributed and not last else contextlib.nullcontext()  # type: ignore[operator]
                with sync, torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                    loss = poison(args, ce_loss(model, data) / batch.grad_accum, rank, step)
                scaler.scale(loss).backward()
                loss_sum += loss.detach().float()
            scaler.unscale_(optimizer)
            corrupt_gradient_once(args, model, rank, step)
            # this rank's own values for the checkpoint manager's checks (before any all-reduce)
            own = {"loss": float(loss_sum), "grad_norm": float(local_norm(p.grad for p in model.parameters() if p.grad is not None))}
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            lr = optimizer.param_groups[0]["lr"]
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < scale:  # an fp16 overflow the scaler skipped: an infinite norm is its business
                del own["grad_norm"]
            skew_replica_once(args, model, rank, world, step)
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if distributed:
                dist.all_reduce(loss_sum)
            net.eval()  # this rank's own running statistics (no DDP forward: no buffer broadcast)
            with torch.no_grad():
                eval_loss = ce_loss(net, evaluation)
            net.train()
            if metrics is not None:
                row = {
                    "step": step,
                    "loss": float(loss_sum) / world,
                    "eval_loss": float(eval_loss),
                    "lr": float(lr),
                    "grad_norm": float(grad_norm),
                    "scale": float(scaler.get_scale()),
                }
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
            manager.maybe_save(step, metrics=own)
        manager.close()
    finally:
        if metrics is not None:
            metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
