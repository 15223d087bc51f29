"""``ckpt adopt``: pretrained weights (a plain ``dcp.save`` directory, a safetensors or a torch
file) become the first checkpoint of a run, under the same guarantees as any other: DCP files
hashed as written, a manifest, ``LATEST``.

The adopted step holds the model only (``model.<name>``; an optimizer's entries in a DCP source
are left out: weights, not a training state). Its manifest's lineage says ``adopted``, and
``CheckpointManager.resume()`` loads it as initial weights: the model (resharded by DCP onto the
run's mesh, any world size), a fresh optimizer, the run's own seeds and batch; it returns the
adopted step so that training starts after it. A torch file is read with ``weights_only=True``
(mmap), a DCP directory's metadata without running its pickle, a safetensors file by the
safetensors package. The weights are held in memory once, in one process.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import ADOPTED, FileEntry, Manifest
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.commit import commit_entries, staged_entries
from ckpt_tool.training.hashing_fs import hashing_writer
from ckpt_tool.training.safe_dcp import load_metadata_safely, load_state, single_process_quietly

OPTIMIZER_PREFIXES = ("optim.", "optimizer.")  # an export's or a training script's optimizer entries


def read_weights(source: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The source's tensors by name (a ``model.`` prefix shared by all removed) and its format."""
    if source.is_dir():
        tensors, fmt = _read_dcp(source), "dcp"
    elif source.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise CkptError(
                "reading safetensors needs the safetensors package", "pip install 'ckpt-tool[export]'", ExitCode.USAGE
            ) from None
        try:
            tensors, fmt = load_file(str(source)), "safetensors"
        except Exception as exc:  # the package's own error types
            raise CkptError(f"{source} is not a readable safetensors file: {exc}", "check the file", ExitCode.USAGE) from exc
    else:
        try:
            loaded = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # weights_only refuses anything but tensors and plain data
            raise CkptError(
                f"{source} is not a torch file of tensors (weights_only): {exc}", "give a state_dict saved with torch.save", ExitCode.USAGE
            ) from exc
        if not isinstance(loaded, dict):
            raise CkptError(
                f"{source} holds a {type(loaded).__name__}, not a state_dict", "torch.save(model.state_dict(), path)", ExitCode.USAGE
            )
        tensors, fmt = {str(k): v for k, v in loaded.items() if isinstance(v, torch.Tensor)}, "torch"
    tensors = {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIXES)}  # weights, not a training state
    if not tensors:
        raise CkptError(f"{source} holds no model tensors", "give the weights of a model", ExitCode.USAGE)
    if all(k.startswith("model.") for k in tensors):
        tensors = {k[len("model.") :]: v for k, v in tensors.items()}
    return tensors, fmt


def _read_dcp(source: Path) -> dict[str, torch.Tensor]:
    if (source / layout.MANIFEST_NAME).exists() or (source / layout.LATEST_NAME).exists():
        raise CkptError(
            f"{source} is already a ckpt-tool checkpoint", "resume from it directly, or `ckpt export` its weights", ExitCode.USAGE
        )
    try:
        with open(source / layout.DCP_METADATA_NAME, "rb") as f:
            metadata = load_metadata_safely(f)
    except FileNotFoundError:
        raise CkptError(
            f"{source} has no .metadata: not a DCP checkpoint", "give a dcp.save directory, a .safetensors or a .pt file", ExitCode.USAGE
        ) from None
    state: dict[str, Any] = {}
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata) and not key.startswith(OPTIMIZER_PREFIXES):
            state[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    load_state(state, source, no_dist=True)
    return state


def adopt(source: Path, directory: Path, step: int = 0) -> Manifest:
    """Write ``source``'s weights as step ``step`` of a new checkpoint directory ``directory``."""
    if not source.exists():
        raise CkptError(f"{source} does not exist", "give a dcp.save directory, a .safetensors or a .pt file", ExitCode.NOT_FOUND)
    if directory.exists() and not directory.is_dir():
        raise CkptError(
            f"{directory} is a file, not a directory: adopt writes a new checkpoint directory there",
            "give the path of a new (or empty) directory for the run's checkpoints",
            ExitCode.USAGE,
        )
    if directory.exists() and any(directory.iterdir()):
        raise CkptError(f"{directory} is not empty", "adopt into a new checkpoint directory (a run starts from it)", ExitCode.USAGE)
    tensors, fmt = read_weights(source)
    store = CheckpointStore(directory, create=True)
    run_id = uuid.uuid4().hex[:16]
    writer, fs = hashing_writer(store.begin_staging(step), run_id, step, 4)
    try:
        with fs.writers_settled(), single_process_quietly():
            dcp.save({"model": tensors}, storage_writer=writer, no_dist=True)
        entries = staged_entries(store, step, run_id, fs, 0, b"{}")
        origin = {"event": ADOPTED, "time": time.time(), "source": str(source.absolute()), "format": fmt, "tensors": len(tensors)}

        def manifest(files: tuple[FileEntry, ...]) -> Manifest:
            return Manifest(run_id, step, time.time(), 1, files, mesh=Mesh.data_parallel(1), lineage=(origin,))

        commit_entries(store, Comm(), step, entries, manifest)
    except BaseException:
        store.discard_staging(step)
        raise
    store.append_event(ADOPTED, step=step, source=str(source.absolute()), format=fmt, tensors=len(tensors))
    return store.read_manifest(step)
