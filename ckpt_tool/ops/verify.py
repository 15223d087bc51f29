"""``ckpt verify`` (and ``ckpt rollback --auto``): build the user's model from an entry point,
load the checkpoint into it and re-measure the probe (``training.probe.check_loaded_model``, the
same check the training loop runs at resume).

The model comes from an entry point ``module:function`` called as ``function(world_size=N,
**entry_kwargs)`` that returns ``(model, loss_fn)``; the manifest records the entry point of the
script that wrote the checkpoint, so checkpoints of the reference recipe need none. Under
``--tp T`` (or when the function takes a ``mesh`` parameter) it is also given ``mesh=``, a torch
``DeviceMesh`` with dimensions ``("dp_shard", "tp")``, to lay the model out as the run did.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from ckpt_tool.core.manifest import Manifest
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.errors import CkptError, DamageError, ExitCode, raised_at
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.hashing_fs import verifying
from ckpt_tool.training.probe import VerifyReport, check_loaded_model
from ckpt_tool.training.safe_dcp import load_state


def require_probe(manifest: Manifest, directory: object) -> None:
    """Refuse (exit ``NOTHING_TO_VERIFY``) a checkpoint saved without a probe: verification
    recomputes the probe's loss and gradient norm, so there is nothing to compare. Not damage."""
    if manifest.probe is None:
        raise CkptError(
            f"step {manifest.step} was saved without a probe (the training script gave CheckpointManager none): "
            "there is nothing to verify, and this says nothing about damage",
            f"`ckpt validate {directory} --step {manifest.step}` checks its files and hashes; "
            "give the manager a probe batch to make later checkpoints verifiable",
            ExitCode.NOTHING_TO_VERIFY,
        )


def require_intact_files(store: CheckpointStore, step: int) -> None:
    """Refuse to load a checkpoint whose files do not match its manifest (missing, truncated,
    extra): the structural check of ``ckpt validate``, before any byte is unpickled or loaded."""
    problems = store.check_files(step, hashes=False).problems
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise DamageError(
            f"step {step} is damaged, not loaded: {problems[0]}{more}",
            f"`ckpt validate {store.root} --step {step}` lists every problem; `ckpt rollback {store.root} --auto` moves LATEST "
            "to the newest good checkpoint",
            ExitCode.FAILED,
        )


def load_entry_point(spec: str) -> Callable[..., Any]:
    """The function an entry point ``module:function`` names. The module is looked up as
    ``python -m`` would from the working directory: that directory first, then the environment."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # the ``ckpt`` console script starts with its bin directory there instead
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CkptError(
            f"entry point {spec!r} is not of the form 'module:function'", "e.g. --entry mypkg.train:build_model", ExitCode.USAGE
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CkptError(
            f"entry point module {module_name!r} does not import: {exc}",
            "check the name and that the package is installed in this environment",
            ExitCode.USAGE,
        ) from None
    except Exception as exc:  # the module's own code failed at import (it is run, as python runs it)
        where = f" ({raised_at(exc)})" if raised_at(exc) else ""
        raise CkptError(
            f"entry point module {module_name!r} failed while it was imported: {type(exc).__name__}: {exc}{where}",
            "the entry point's module is imported, not run as a script: keep its training under `if __name__ == '__main__':`",
            ExitCode.USAGE,
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CkptError(
            f"entry point {spec!r}: {module_name} has no function {attr!r}", "name a function that returns (model, loss_fn)", ExitCode.USAGE
        )
    return fn


def build_from_entry_point(
    spec: str, world_size: int, kwargs: dict[str, Any], device_mesh: Any = None, tp: int = 1
) -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    """The ``(model, loss_fn)`` the entry point ``spec`` (``module:function``) builds for ``world_size``
    ranks with the manifest's ``kwargs``; ``device_mesh`` is passed as ``mesh=`` when the function takes
    one. Raises ``CkptError`` (USAGE) when it cannot be loaded, takes no mesh while ``tp > 1``, fails
    (its error named) or returns anything else."""
    fn = load_entry_point(spec)
    try:
        takes_mesh = "mesh" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_mesh = False
    if tp > 1 and not takes_mesh:
        raise CkptError(
            f"entry point {spec!r} takes no mesh parameter, so it cannot lay the model out with tensor parallel {tp}",
            "add a mesh=None parameter (a torch DeviceMesh with dimensions dp_shard, tp) and shard the model on it, or verify with --tp 1",
            ExitCode.USAGE,
        )
    if takes_mesh:
        kwargs = {**kwargs, "mesh": device_mesh}
    try:
        result = fn(world_size=world_size, **kwargs)
    except CkptError:
        raise
    except Exception as exc:  # the user's code: any error, reported with its type
        raise CkptError(
            f"entry point {spec!r} failed when called as {spec.partition(':')[2]}(world_size={world_size}, **{kwargs!r}): {type(exc).__name__}: {exc}",
            "it must accept world_size and the manifest's entry_kwargs and return (model, loss_fn); run with --debug for the traceback",
            ExitCode.USAGE,
        ) from exc
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module) and callable(result[1])):
        raise CkptError(
            f"entry point {spec!r} returned {type(result).__name__}, not (model, loss_fn)",
            "return a tuple (torch.nn.Module, loss function(model, batch) -> scalar)",
            ExitCode.USAGE,
        )
    return result


def verify_checkpoint(
    store: CheckpointStore, step: int, entry: str | None = None, mesh: Mesh | None = None, device_mesh: Any = None
) -> VerifyReport:
    """Build the model from the entry point on ``mesh`` (default: one process), load the
    checkpoint's parameters, run the checks."""
    mesh = mesh or Mesh.data_parallel(1)
    manifest = store.read_manifest(step)
    require_probe(manifest, store.root)
    require_intact_files(store, step)
    spec = entry or manifest.entry_point
    if spec is None:
        raise CkptError(
            f"step {step} records no entry point to build the model",
            "pass --entry module:function (or set entry_point in [tool.ckpt])",
            ExitCode.USAGE,
        )
    model, loss_fn = build_from_entry_point(spec, mesh.world_size, dict(manifest.entry_kwargs), device_mesh, mesh.size("tp"))
    state = {"model": get_model_state_dict(model)}
    # every file the model needs is hash-checked as it loads (cooperatively across nodes: each byte read once)
    load_state(state, store.step_path(step), no_dist=not torch.distributed.is_initialized(), verify_with=verifying(manifest, step))
    set_model_state_dict(model, state["model"])
    return check_loaded_model(model, loss_fn, store, step, mesh)
