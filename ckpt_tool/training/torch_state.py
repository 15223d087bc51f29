"""The model and optimizer state dicts DCP saves from and loads into, without torch's costly defaults.

torch's ``get_state_dict`` builds the state of an optimizer that has none yet (before its first
step, or fresh at a resume) by giving every parameter a zero gradient, a full copy of the model
in memory, and stepping with lr=0; ``set_state_dict`` does it once more for an optimizer that keeps
no state (SGD without momentum), then copies every model entry onto itself although DCP filled
them in place. Here the zero gradients are stride-0 views of one zero (no memory; dense zeros for
fused optimizers, whose kernels may assume dense gradients), they stay on the parameters until
the loaded state is set so torch does not build the state a second time, and the model's
``load_state_dict`` runs only when DCP could not fill every entry in place. What is saved and
loaded is exactly torch's: the same state dicts, from the same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_optimizer_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from ckpt_tool.timing import span

log = logging.getLogger("ckpt_tool")


def align_replicated_buffers(model: nn.Module) -> None:
    """DDP with ``broadcast_buffers`` (its default) gives every rank rank 0's buffers (BatchNorm's
    running statistics) at the start of its next forward; until then each rank's differ (each
    updated them with its own batch). A checkpoint holds one copy of a replicated entry, written by
    whichever rank DCP's planner picks (it balances the bytes): rank 0's are broadcast now, as that
    forward would, so the copy saved is the one the run goes on with. Without ``broadcast_buffers``
    every rank keeps buffers of its own, which one copy cannot restore (README: exactness)."""
    if not (isinstance(model, DistributedDataParallel) and model.broadcast_buffers and dist.is_initialized()):
        return
    source = dist.get_global_rank(model.process_group, 0)
    for buffer in model.module.buffers():
        dist.broadcast(buffer, src=source, group=model.process_group)


class LiveState:
    """The state dicts of one model and optimizer, their tensors the live ones."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with span("state_dict.get"):
            self.model_sd, self.optim_sd = get_state_dict(model, optimizer)
        self._targets = dict(self.model_sd)  # what DCP is asked to fill in place

    def set_loaded(self) -> None:
        """Make what DCP loaded into ``model_sd``/``optim_sd`` the model's and optimizer's state."""
        with span("state_dict.set"):
            if model_filled_in_place(self.model, self.model_sd, self._targets):
                set_optimizer_state_dict(self.model, self.optimizer, self.optim_sd)
            else:
                set_state_dict(self.model, self.optimizer, model_state_dict=self.model_sd, optim_state_dict=self.optim_sd)


@contextmanager
def live_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[LiveState]:
    """The state dicts to save from or load into (``LiveState.set_loaded`` after a load),
    with an optimizer that has no state yet built without a copy of the model in memory."""
    with span("state_dict.build_optimizer"):
        given = build_optimizer_state(optimizer)
    try:
        yield LiveState(model, optimizer)
    finally:
        for p in given:
            p.grad = None


def build_optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """torch's optimizer-state initialisation (zero gradients, a step with lr=0) with gradients
    that take no memory. Returns the parameters given a gradient, to be set back to None once
    the state dicts are done (while they are on, torch does not initialise again). Nothing is
    done when the optimizer has state or a parameter has a gradient (torch would do nothing)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return []
    given = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p) if group.get("fused") else _zero_view(p)
                given.append(p)
    lrs = [group.get("lr") for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            if "lr" in group:
                group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
        optimizer.step()
    except RuntimeError as exc:  # an optimizer that wants dense gradients: torch's own way
        log.debug("ckpt: building the optimizer state with stride-0 gradients failed (%s); torch builds it", exc)
        optimizer.state.clear()
        for p in given:
            p.grad = None
        return []
    finally:
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            if "lr" in group:
                group["lr"] = lr
    return given


def _zero_view(p: torch.Tensor) -> torch.Tensor:
    """A zero tensor shaped (and for a DTensor, placed) like ``p``, all elements one zero."""
    if isinstance(p, DTensor):
        local = p.to_local()
        zero = torch.zeros((), dtype=local.dtype, device=local.device).expand(local.shape)
        return DTensor.from_local(zero, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
    return torch.zeros((), dtype=p.dtype, device=p.device).expand(p.shape)


def _storage(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.untyped_storage().data_ptr()


def model_filled_in_place(model: nn.Module, loaded: dict[str, Any], targets: dict[str, Any]) -> bool:
    """Whether every entry of ``loaded`` is still the tensor DCP was given and that tensor is
    the model's own storage: then the model already holds the checkpoint and ``load_state_dict``
    would copy each tensor onto itself."""
    live = {_storage(t) for t in model.state_dict().values() if isinstance(t, torch.Tensor)}
    return loaded.keys() == targets.keys() and all(
        isinstance(v, torch.Tensor) and v is targets[k] and (v.numel() == 0 or _storage(v) in live) for k, v in loaded.items()
    )
