"""The probe: loss and gradient norm of the saved parameters on a fixed batch.

Measured at save time and stored in the manifest; verification recomputes them after a load.
Measuring does not disturb training: existing ``.grad`` are put back, the optimizer is not
touched, RNG streams are forked, and the model runs in eval mode (no dropout) and is put back
in the mode it was in. Under FSDP every rank runs the probe on the same (replicated) batch, so
the loss and the gradient (averaged over ranks) equal those of one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ckpt_tool.core.manifest import Probe


@dataclass(frozen=True)
class ProbeSpec:
    """``batch`` is a dict of tensors stored in the checkpoint; ``loss_fn(model, batch)`` -> scalar loss."""

    batch: dict[str, torch.Tensor]
    loss_fn: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def _scalar(t: Any) -> float:
    if hasattr(t, "full_tensor"):  # DTensor (FSDP2): the reduced value, replicated
        t = t.full_tensor()
    return float(t.detach().float().item())


def measure(model: nn.Module, spec: ProbeSpec, lr: float, step: int) -> Probe:
    params = [p for p in model.parameters() if p.requires_grad]
    saved_grads = [p.grad for p in params]
    was_training = model.training
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        for p in params:
            p.grad = None
        model.eval()
        with torch.random.fork_rng(devices=devices):
            loss = spec.loss_fn(model, spec.batch)
            loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0) if grads else torch.zeros(())
        return Probe(loss=_scalar(loss), grad_norm=_scalar(grad_norm), lr=float(lr), step=step)
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g
        model.train(was_training)
