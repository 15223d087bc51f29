"""Reading DCP checkpoints without running code from them.

torch's ``FileSystemReader.read_metadata`` unpickles ``.metadata`` with plain ``pickle.load``,
and ``DefaultLoadPlanner.load_bytes`` loads non-tensor entries with ``torch.load(weights_only=
False)``. Both run whatever a hostile file asks. Here ``.metadata`` is read by an unpickler that
resolves only the handful of DCP metadata classes (plain data holders), and byte entries load
with ``weights_only=True`` (primitive types and tensors only). A refused class raises
``CkptError`` naming it.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

from ckpt_tool.core.state_fit import fit_problems
from ckpt_tool.errors import CkptError, DamageError, ExitCode, MisfitError, PermissionDeniedError
from ckpt_tool.supervise.round_end import node_name
from ckpt_tool.timing import span
from ckpt_tool.training.hashing_fs import HashingFileSystem

COOPERATIVE_ENV = "CKPT_COOPERATIVE_LOAD"  # 1 or 0: the job's choice where the caller leaves it (None)

_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "TensorProperties",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # a lookup in a table of torch layouts
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only allow-listed metadata classes and torch dtype constants."""

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only the DCP metadata classes of ``_ALLOWED`` and torch dtypes; raises ``CkptError`` for
        anything else (the pickle is damaged or hostile), before any of its code runs."""
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise DamageError(
            f"refused to load {module}.{name} from checkpoint metadata: it is not a DCP metadata type",
            "the .metadata file is damaged or hostile; do not load it with torch's own reader either: "
            "run `ckpt validate` and `ckpt rollback`",
        )


def load_metadata_safely(stream: io.BufferedIOBase) -> Metadata:
    """The DCP ``Metadata`` pickled in ``stream``, read with ``RestrictedUnpickler``. Raises ``CkptError``
    when it asks for a class outside the allow-list, is unreadable, or holds anything but ``Metadata``."""
    try:
        metadata = RestrictedUnpickler(stream).load()
    except CkptError:
        raise
    except Exception as exc:  # noqa: BLE001 - damaged bytes raise any of pickle's many error types
        raise DamageError(
            f"the DCP .metadata is unreadable ({type(exc).__name__}: {exc})", "run `ckpt validate` and `ckpt rollback`"
        ) from None
    if not isinstance(metadata, Metadata):
        raise DamageError(
            f"the DCP .metadata holds a {type(metadata).__name__}, not DCP Metadata", "run `ckpt validate` and `ckpt rollback`"
        )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """torch's ``FileSystemReader`` whose ``.metadata`` is read by ``load_metadata_safely`` instead of ``pickle.load``
    (from ``metadata_bytes`` when given: read once for the whole job, ``load_state``)."""

    metadata_bytes: bytes | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's DCP metadata, unpickled safely (``load_metadata_safely``'s errors), with this
        reader's load id set as torch's reader sets it."""
        if self.metadata_bytes is not None and kwargs.get("rank") is None:
            metadata = load_metadata_safely(io.BytesIO(self.metadata_bytes))
        else:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = load_metadata_safely(f)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Loads non-tensor entries (optimizer hyper-parameters...) with ``weights_only=True``, and
    notes the checkpoint's entries that the target state does not ask for (DCP skips them
    without a word): ``not_loaded``."""

    not_loaded: tuple[str, ...] = ()

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        """DCP's planner set-up, then a check that every tensor the target state asks for is in the
        checkpoint with its shape: raises ``MisfitError`` (nothing loaded yet) naming what does not fit;
        the checkpoint's entries nobody asked for go to ``not_loaded``."""
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is None:
            return
        saved = {k: (tuple(md.size) if isinstance(md, TensorStorageMetadata) else None) for k, md in metadata.state_dict_metadata.items()}
        wanted = {k: (tuple(v.size()) if isinstance(v, torch.Tensor) else None) for k, v in self.state_dict.items()}
        problems = fit_problems(wanted, saved)
        if problems:
            raise MisfitError(
                "the checkpoint does not fit this run's model or optimizer: " + "; ".join(problems),
                "resume with the model and optimizer that wrote it, or start a new checkpoint directory; the checkpoint is intact and was left in place",
            )
        self.not_loaded = tuple(sorted(set(saved) - set(wanted)))

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Load one non-tensor entry with ``torch.load(weights_only=True)`` into the target state; raises
        ``CkptError`` for an entry that is not plain data (damaged or hostile)."""
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise DamageError(
                f"refused to load the checkpoint entry {read_item.dest_index.fqn!r}: it is not plain data ({exc})".splitlines()[0],
                "the checkpoint is damaged or hostile: run `ckpt validate` and `ckpt rollback`",
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def spans_nodes(group: Any) -> bool:
    """Whether the group's ranks are on more than one node (SLURM's node name, else the host name).
    Collective over ``group``."""
    names: list[Any] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(names, node_name(), group=group)
    return len(set(names)) > 1


def _check_metadata(path: Path, verify_with: HashingFileSystem | None) -> bytes:
    """``path``'s ``.metadata``, checked against the manifest (with ``verify_with``) and safe to unpickle;
    raises ``DamageError`` when it is missing, damaged or hostile."""
    metadata_path = path / ".metadata"
    try:
        with (verify_with or FileSystem()).create_stream(metadata_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DamageError(f"{metadata_path} is missing", "run `ckpt validate` and `ckpt rollback`") from None
    try:
        load_metadata_safely(io.BytesIO(data))
    except CkptError as exc:
        raise DamageError(f"{metadata_path}: {exc.message}", exc.hint) from None
    return data


def _metadata_once(path: Path, verify_with: HashingFileSystem, group: Any) -> bytes:
    """``_check_metadata`` on the group's first rank, its bytes (or its error, raised) on every rank."""
    box: list[Any] = [None]
    if torch.distributed.get_rank(group) == 0:
        try:
            box[0] = _check_metadata(path, verify_with)
        except (CkptError, OSError) as exc:  # raised on every rank: none is left waiting for bytes that never come
            box[0] = exc
    torch.distributed.broadcast_object_list(box, src=torch.distributed.get_global_rank(group, 0), group=group)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


@contextmanager
def single_process_quietly() -> Iterator[None]:
    """DCP without torch.distributed warns "assuming the intent is to ... in a single process" at
    every call: yes, that is the intent (one process, a fast-tier copy, an adoption)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def dcp_failures(exc: CheckpointException) -> list[BaseException]:
    """The exceptions of each rank inside DCP's CheckpointException (DCP wraps them)."""
    out = []
    for failure in exc.failures.values():
        inner = failure[0] if isinstance(failure, tuple) and failure else failure  # (exception, traceback summary)
        if isinstance(inner, BaseException):
            out.append(inner)
    return out


def load_state(
    state: dict[str, Any],
    path: Path,
    process_group: Any = None,
    no_dist: bool = False,
    verify_with: HashingFileSystem | None = None,
    threads: int = 4,
    cooperative: bool | None = None,
) -> tuple[str, ...]:
    """``dcp.load`` into ``state`` in place, refusing hostile metadata before DCP reads it.
    Returns the checkpoint's entries that ``state`` did not ask for (not loaded).

    With ``verify_with`` every file is hash-checked against the manifest as it is read (one
    pass over the data, ``threads`` files at a time: ``training.verified_reader``); with it,
    several ranks and ``cooperative``, each byte is read once per job: ``.metadata`` by the
    coordinator (checked, then broadcast), each data file by one rank that sends the others what
    they need of it. ``cooperative`` None: ``$CKPT_COOPERATIVE_LOAD`` (1 or 0) when set, else
    whether the ranks are on more than one node (``spans_nodes``).

    DCP wraps every failure in ``CheckpointException`` (a BaseException); it is turned back into
    the ``CkptError`` that caused it, or a ``CkptError`` naming the first failure.
    """
    group = None
    if verify_with is not None and not no_dist and torch.distributed.is_initialized():
        group = process_group if process_group is not None else torch.distributed.group.WORLD
        if cooperative is None:
            chosen = os.environ.get(COOPERATIVE_ENV)
            cooperative = chosen == "1" if chosen in ("0", "1") else spans_nodes(group)
        group = group if cooperative else None
    # checked before DCP sees it, and what DCP then reads (not the file again)
    metadata_bytes = _metadata_once(path, verify_with, group) if group is not None else _check_metadata(path, verify_with)
    if verify_with is not None:
        from ckpt_tool.training.verified_reader import StreamingVerifiedReader

        reader: SafeFileSystemReader = StreamingVerifiedReader(path, verify_with, threads, group=group)
    else:
        reader = SafeFileSystemReader(path)
    reader.metadata_bytes = metadata_bytes
    try:
        with span("load.dcp"), single_process_quietly():
            planner = SafeLoadPlanner()
            dcp.load(state, storage_reader=reader, planner=planner, process_group=process_group, no_dist=no_dist)
    except CheckpointException as exc:
        failures = dcp_failures(exc)
        for failure in failures:
            if isinstance(failure, CkptError):
                raise failure from None
            if isinstance(failure, PermissionError):
                raise PermissionDeniedError(
                    f"permission denied reading {failure.filename or path}: it was not loaded (this is not damage)",
                    "run as the user who owns the checkpoint, or ask them to grant read access",
                    ExitCode.USAGE,
                ) from None
        first = failures[0] if failures else exc
        text = str(first)
        raise DamageError(
            f"loading {path} failed: {type(first).__name__}: {text.splitlines()[0] if text else ''}",
            "run `ckpt validate` and `ckpt rollback`",
        ) from None
    return planner.not_loaded
