"""The probe: loss and gradient norm of the saved parameters on a fixed batch.

Measured at save time and stored in the manifest; after a load, ``check_loaded_model`` measures
it again on the model that now holds the checkpoint's parameters (in the training loop at
resume, and offline for ``ckpt verify``) and compares (``core.probe_checks``).
Measuring does not disturb training: existing ``.grad`` are put back, the optimizer is not
touched, RNG streams are forked, and the model runs in eval mode (no dropout) and is put back
in the mode it was in. Under FSDP every rank runs the probe on the same (replicated) batch, so
the loss and the gradient (averaged over ranks) equal those of one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ckpt_tool.core import layout
from ckpt_tool.core.exactness import how_to_reproduce, trajectory_differences
from ckpt_tool.core.manifest import Manifest, Probe
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.core.probe_checks import Check, probe_checks
from ckpt_tool.errors import CkptError, DamageError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import state_codec
from ckpt_tool.training.grad_norm import total_norm
from ckpt_tool.training.safe_dcp import load_metadata_safely, load_state

EXACT_KEYS = ("world_size", "mesh", "tp", "threads", "torch", "dtype", "device_type")


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
    """The probe of ``model`` as it stands: loss and gradient norm on ``spec.batch``, with ``lr`` and
    ``step`` recorded as given. Runs forward and backward in eval mode under a forked RNG; the
    parameters' ``.grad``, the training mode and the RNG streams are as before. Collective when the
    parameters are sharded (the norm is global)."""
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
        grad_norm = total_norm(grads)  # parameters may live on several meshes (tensor parallel x FSDP)
        return Probe(loss=_scalar(loss), grad_norm=_scalar(grad_norm), lr=float(lr), step=step)
    finally:
        for p, g in zip(params, saved_grads, strict=True):
            p.grad = g
        model.train(was_training)


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of a probe verification of checkpoint ``step``: each check, whether they were compared
    bit-exactly, and when not, why (``differences``) and what would make them so (``reproduce``); the
    mesh that saved the checkpoint and the one that checked it (``dp_shard=2,tp=2``)."""

    step: int
    checks: tuple[Check, ...]
    exact: bool
    differences: tuple[str, ...]  # why the comparison is not bit-exact
    reproduce: tuple[str, ...] = ()  # options/settings that would make it bit-exact, e.g. "--nproc 2"
    saved_mesh: str | None = None  # "dp_shard=2,tp=2"
    mesh: str | None = None  # the mesh of this check

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        """One line per failed check (``Check.describe``); empty when all passed."""
        return [c.describe() for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        """``ckpt verify --json``'s form: the step, ``ok``, ``exact``, the differences and how to reproduce,
        both meshes and every check."""
        return {
            "step": self.step,
            "ok": self.ok,
            "exact": self.exact,
            "differences": list(self.differences),
            "reproduce": list(self.reproduce),
            "saved_mesh": self.saved_mesh,
            "mesh": self.mesh,
            "checks": [c.to_json() for c in self.checks],
        }


def load_probe_batch(path: Any, process_group: Any = None) -> dict[str, torch.Tensor]:
    """Allocate the stored probe tensors from the (safely read) DCP metadata, then load them."""
    with open(path / layout.DCP_METADATA_NAME, "rb") as f:
        metadata = load_metadata_safely(f)
    batch = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("probe.") and hasattr(meta, "size"):
            batch[key.removeprefix("probe.")] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not batch:
        raise DamageError(
            f"{path} holds no probe batch", "the checkpoint was saved without a probe: only `ckpt validate` applies", ExitCode.FAILED
        )
    state = {"probe": batch}
    load_state(state, path, process_group=process_group, no_dist=not torch.distributed.is_initialized())
    return state["probe"]


def current_env(model: nn.Module, mesh: Mesh) -> dict[str, Any]:
    """What bit-exactness depends on here, for the manifest's ``env`` and for comparing at verify: torch
    version, thread count, world size and mesh, tp size, and the dtype and device type of the model's
    first parameter (None without parameters)."""
    first = next(model.parameters(), None)
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "world_size": mesh.world_size,
        "mesh": mesh.compact(),
        "tp": mesh.size("tp"),  # what `ckpt verify --tp` sets (--nproc sets the rest of the mesh)
        "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
        "device_type": first.device.type if first is not None else None,
    }


def check_loaded_model(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    store: CheckpointStore,
    step: int,
    mesh: Mesh,
    process_group: Any = None,
) -> VerifyReport:
    """The four checks on a model that already holds the checkpoint's parameters."""
    manifest = store.read_manifest(step)
    if manifest.probe is None:
        raise CkptError(
            f"step {step} has no recorded probe", "only `ckpt validate` applies to checkpoints saved without a probe", ExitCode.FAILED
        )
    path = store.step_path(step)
    rank_file = path / layout.rank_state_name(0)  # step and scheduler are job-wide: rank 0 has them at any world size
    rank_state = state_codec.loads(rank_file.read_bytes(), str(rank_file))
    return verify_model(model, ProbeSpec(load_probe_batch(path, process_group), loss_fn), manifest, rank_state, mesh)


def verify_model(model: nn.Module, spec: ProbeSpec, manifest: Manifest, rank_state: dict[str, Any], mesh: Mesh) -> VerifyReport:
    """The four checks of a model that holds ``manifest``'s step (its recorded probe, which must
    be set), with the probe batch of ``spec`` and a rank's JSON state (step, scheduler)."""
    assert manifest.probe is not None
    step = manifest.step
    sched = rank_state.get("scheduler") or {}
    lr = float(sched["_last_lr"][0]) if sched.get("_last_lr") else None
    measured = measure(model, spec, lr or 0.0, step)
    saved = {k: manifest.env.get(k) for k in EXACT_KEYS if k in manifest.env}
    now = current_env(model, mesh)
    differences = tuple(trajectory_differences(saved, now))
    checks = probe_checks(manifest.probe, manifest.step, rank_state.get("step"), lr, measured, exact=not differences)
    reproduce = tuple(how_to_reproduce(saved, now))
    return VerifyReport(step, tuple(checks), not differences, differences, reproduce, manifest.layout.compact(), mesh.compact())
