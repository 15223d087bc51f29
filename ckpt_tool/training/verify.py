"""Verification of a checkpoint by recomputation: load it into the user's model and re-measure
the probe (``ckpt verify``, ``ckpt rollback --auto`` and the manager's resume).

The model comes from an entry point ``module:function`` called as ``function(world_size=N,
**entry_kwargs)`` that returns ``(model, loss_fn)``; the manifest records the entry point of the
script that wrote the checkpoint, so checkpoints of the reference recipe need none.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from ckpt_tool.core import layout
from ckpt_tool.core.exactness import how_to_reproduce, trajectory_differences
from ckpt_tool.core.verification import Check, probe_checks
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import state_codec
from ckpt_tool.training.probe import ProbeSpec, measure
from ckpt_tool.training.safe_dcp import load_metadata_safely, load_state

EXACT_KEYS = ("world_size", "threads", "torch", "dtype", "device_type")


@dataclass(frozen=True)
class VerifyReport:
    step: int
    checks: tuple[Check, ...]
    exact: bool
    differences: tuple[str, ...]  # why the comparison is not bit-exact
    reproduce: tuple[str, ...] = ()  # options/settings that would make it bit-exact, e.g. "--nproc 2"

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "ok": self.ok,
            "exact": self.exact,
            "differences": list(self.differences),
            "reproduce": list(self.reproduce),
            "checks": [c.to_json() for c in self.checks],
        }


def load_entry_point(spec: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CkptError(f"entry point {spec!r} is not of the form 'module:function'", "e.g. --entry mypkg.train:build_model", ExitCode.USAGE)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CkptError(f"entry point module {module_name!r} does not import: {exc}", "check the name and that the package is installed in this environment", ExitCode.USAGE) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CkptError(f"entry point {spec!r}: {module_name} has no function {attr!r}", "name a function that returns (model, loss_fn)", ExitCode.USAGE)
    return fn


def build_from_entry_point(spec: str, world_size: int, kwargs: dict[str, Any]) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    try:
        result = load_entry_point(spec)(world_size=world_size, **kwargs)
    except CkptError:
        raise
    except Exception as exc:  # the user's code: any error, reported with its type
        raise CkptError(
            f"entry point {spec!r} failed when called as {spec.partition(':')[2]}(world_size={world_size}, **{kwargs!r}): {type(exc).__name__}: {exc}",
            "it must accept world_size and the manifest's entry_kwargs and return (model, loss_fn); run with --debug for the traceback",
            ExitCode.USAGE,
        ) from exc
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module) and callable(result[1])):
        raise CkptError(f"entry point {spec!r} returned {type(result).__name__}, not (model, loss_fn)", "return a tuple (torch.nn.Module, loss function(model, batch) -> scalar)", ExitCode.USAGE)
    return result


def load_probe_batch(path: Any, process_group: Any = None) -> dict[str, torch.Tensor]:
    """Allocate the stored probe tensors from the (safely read) DCP metadata, then load them."""
    with open(path / layout.DCP_METADATA_NAME, "rb") as f:
        metadata = load_metadata_safely(f)
    batch = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("probe.") and hasattr(meta, "size"):
            batch[key.removeprefix("probe.")] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not batch:
        raise CkptError(f"{path} holds no probe batch", "the checkpoint was saved without a probe: only `ckpt validate` applies", ExitCode.FAILED)
    state = {"probe": batch}
    load_state(state, path, process_group=process_group, no_dist=not torch.distributed.is_initialized())
    return state["probe"]


def current_env(model: nn.Module, world_size: int) -> dict[str, Any]:
    first = next(model.parameters(), None)
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "world_size": world_size,
        "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
        "device_type": first.device.type if first is not None else None,
    }


def check_loaded_model(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    store: CheckpointStore,
    step: int,
    world_size: int,
    process_group: Any = None,
) -> VerifyReport:
    """The four checks on a model that already holds the checkpoint's parameters."""
    manifest = store.read_manifest(step)
    if manifest.probe is None:
        raise CkptError(f"step {step} has no recorded probe", "only `ckpt validate` applies to checkpoints saved without a probe", ExitCode.FAILED)
    path = store.step_path(step)
    rank_file = path / layout.rank_state_name(0)  # step and scheduler are job-wide: rank 0 has them at any world size
    rank_state = state_codec.loads(rank_file.read_bytes(), str(rank_file))
    sched = rank_state.get("scheduler") or {}
    lr = float(sched["_last_lr"][0]) if sched.get("_last_lr") else None
    measured = measure(model, ProbeSpec(load_probe_batch(path, process_group), loss_fn), lr or 0.0, step)
    saved = {k: manifest.env.get(k) for k in EXACT_KEYS if k in manifest.env}
    now = current_env(model, world_size)
    differences = tuple(trajectory_differences(saved, now))
    checks = probe_checks(manifest.probe, manifest.step, rank_state.get("step"), lr, measured, exact=not differences)
    return VerifyReport(step, tuple(checks), not differences, differences, tuple(how_to_reproduce(saved, now)))


def verify_step(store: CheckpointStore, step: int, entry: str | None = None, world_size: int = 1) -> VerifyReport:
    """Build the model from the entry point, load the checkpoint's parameters, run the checks."""
    manifest = store.read_manifest(step)
    spec = entry or manifest.entry_point
    if spec is None:
        raise CkptError(f"step {step} records no entry point to build the model", "pass --entry module:function (or set entry_point in [tool.ckpt])", ExitCode.USAGE)
    model, loss_fn = build_from_entry_point(spec, world_size, dict(manifest.entry_kwargs))
    state = {"model": get_model_state_dict(model)}
    load_state(state, store.step_path(step), no_dist=not torch.distributed.is_initialized())
    set_model_state_dict(model, state["model"])
    return check_loaded_model(model, loss_fn, store, step, world_size)
