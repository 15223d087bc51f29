"""``ckpt export``: consolidated full tensors of a checkpoint in one file, safetensors or torch.

Safe by construction: every file of the step is hash-checked against its manifest first; the
DCP metadata is read by the restricted unpickler (``training.safe_dcp``) and items are loaded
with ``weights_only``; no pickle of the checkpoint is ever executed. The tensor table the
metadata describes must fit in the files the manifest lists (hostile metadata claiming more is
refused before anything is allocated).

Streaming: tensors are loaded a batch at a time (``core.export_plan.batches``: at most the
largest tensor's bytes) and written as they come, so memory is bounded by the largest tensor,
not the model. The safetensors package cannot write a file piece by piece (``save_file`` takes
the whole dict), so the file is written here, header first (``core.export_plan``), in the
format's documented layout; the package (when installed) then opens it as a check. For
``--format torch``, ``torch.save`` writes the file's structure with ``skip_data`` (fake tensors:
no memory), and the bytes of each tensor are written into its record, with the zip's CRC-32
fields set, so that ``torch.load(weights_only=True)`` and ``zipfile`` both read it.

The output is written beside its place and renamed in: an interrupted export leaves nothing.
"""

from __future__ import annotations

import ctypes
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ckpt_tool.core.export_plan import ExportEntry, TensorEntry, batches, export_entries, safetensors_header, unsupported_dtypes
from ckpt_tool.errors import CkptError, DamageError, ExitCode
from ckpt_tool.store.durable import fsync_dir
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.safe_dcp import load_metadata_safely, load_state

FORMATS = ("safetensors", "torch")


@dataclass(frozen=True)
class Exported:
    """What ``ckpt export`` wrote: the file, the step, the format (``safetensors`` or ``torch``), how many
    tensors and how many bytes of tensor data, and the checkpoint's entries left out."""

    path: Path
    step: int
    format: str
    tensors: int
    bytes: int
    skipped: tuple[str, ...]  # what is no weights: non-tensor entries, the probe batch (and the optimizer's with --model-only)


def tensor_table(store: CheckpointStore, step: int) -> tuple[list[TensorEntry], list[str]]:
    """The step's tensors (DCP key, full shape, dtype) and its non-tensor keys, from the
    metadata read without running its pickle; refused when it claims more than its files hold."""
    path = store.step_path(step) / ".metadata"
    try:
        with open(path, "rb") as f:
            metadata = load_metadata_safely(f)
    except FileNotFoundError:
        raise DamageError(f"{path} is missing", "run `ckpt validate` and `ckpt rollback`", ExitCode.FAILED) from None
    tensors, others = [], []
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            dtype = md.properties.dtype
            tensors.append(TensorEntry(key, tuple(int(d) for d in md.size), str(dtype).removeprefix("torch."), dtype.itemsize))
        else:
            others.append(key)
    held = store.read_manifest(step).total_bytes
    claimed = sum(t.nbytes for t in tensors)
    if claimed > held:
        raise DamageError(
            f"step {step}'s metadata describes {claimed} bytes of tensors but its files hold {held}: it was not written by DCP as is",
            "export another step (`ckpt list`), or run `ckpt validate`",
            ExitCode.FAILED,
        )
    return tensors, others


def checked(store: CheckpointStore, step: int, threads: int | None = None) -> None:
    """Every file of the step hash-checked against the manifest, or a ``CkptError`` saying what is wrong."""
    result = store.check_files(step, threads=threads)
    if result.unreadable:
        raise CkptError(
            f"permission denied reading {', '.join(result.unreadable[:3])} of step {step}: not exported (this is not damage)",
            "run as the user who owns the checkpoint, or ask them to grant read access",
            ExitCode.USAGE,
        )
    if not result.ok:
        shown = "; ".join(f"{p.file}: {p.what}" for p in result.problems[:3])
        raise DamageError(
            f"step {step} is damaged ({shown}): not exported",
            "export another step (`ckpt list` shows which are valid), or `ckpt rollback --auto`",
            ExitCode.FAILED,
        )


def stream(store: CheckpointStore, step: int, entries: list[ExportEntry]) -> Iterator[tuple[ExportEntry, memoryview]]:
    """Each entry's full tensor as raw bytes, in order, loaded a batch at a time."""
    for batch in batches(entries, 0):
        state = {e.tensor.key: torch.empty(e.tensor.shape, dtype=getattr(torch, e.tensor.dtype)) for e in batch}
        load_state(state, store.step_path(step), no_dist=True)
        for e in batch:
            tensor = state.pop(e.tensor.key)
            yield e, memoryview(tensor.reshape(-1).view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")
            del tensor


def export_checkpoint(store: CheckpointStore, step: int, fmt: str, out: Path, model_only: bool = False, force: bool = False) -> Exported:
    """Write the consolidated tensors of ``step`` to the file ``out`` in format ``fmt`` (model tensors only
    with ``model_only``), after hash-checking every file of the step; written under a temporary name,
    then renamed and fsynced. Raises ``CkptError``: USAGE for a bad format, an ``out`` that exists
    (without ``force``), is a directory or has no parent, nothing to export or a dtype safetensors lacks;
    the check's errors for a damaged step."""
    if fmt not in FORMATS:
        raise CkptError(f"unknown format {fmt!r}", f"use one of: {', '.join(FORMATS)}", ExitCode.USAGE)
    if out.is_dir():
        suffix = "pt" if fmt == "torch" else "safetensors"
        raise CkptError(
            f"--out {out} is a directory: export writes one file",
            f"give a file name, e.g. --out {out / f'step-{step}.{suffix}'}",
            ExitCode.USAGE,
        )
    if out.exists() and not force:
        raise CkptError(f"{out} exists", "pass --force to replace it, or another --out", ExitCode.USAGE)
    if not out.parent.is_dir():
        raise CkptError(f"{out.parent} is not a directory", "create it first, or pass another --out", ExitCode.USAGE)
    checked(store, step)
    tensors, others = tensor_table(store, step)
    entries = export_entries(tensors, model_only)
    if not entries:
        raise CkptError(f"step {step} holds no {'model ' if model_only else ''}tensors to export", "see `ckpt inspect`", ExitCode.USAGE)
    if fmt == "safetensors" and unsupported_dtypes(entries):
        raise CkptError(f"safetensors has no dtype for {', '.join(unsupported_dtypes(entries)[:3])}", "use --format torch", ExitCode.USAGE)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    manifest = store.read_manifest(step)
    try:
        writer = _write_safetensors if fmt == "safetensors" else _write_torch
        writer(partial, entries, lambda: stream(store, step, entries), {"ckpt_step": str(step), "ckpt_run_id": manifest.run_id})
        os.replace(partial, out)
        fsync_dir(out.parent)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _reopen(out, fmt)
    exported = {e.tensor.key for e in entries}
    skipped = tuple(others) + tuple(t.key for t in tensors if t.key not in exported)
    return Exported(out, step, fmt, len(entries), sum(e.tensor.nbytes for e in entries), skipped)


Source = Callable[[], Iterator[tuple[ExportEntry, memoryview]]]


def return_freed_memory() -> None:
    """For the export's own process (``ckpt export``): glibc's malloc raises its mmap threshold
    after the first large free and then keeps freed tensors' memory in its heap (measured: 112 MiB
    peak for 8 MiB tensors instead of 55); a fixed 1 MiB threshold returns each tensor when freed.
    A no-op without glibc."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _write_safetensors(path: Path, entries: list[ExportEntry], source: Source, metadata: dict[str, str]) -> None:
    with open(path, "wb") as f:
        f.write(safetensors_header(entries, {"format": "pt", **metadata}))
        for _, data in source():
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_torch(path: Path, entries: list[ExportEntry], source: Source, metadata: dict[str, str]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fakes = {e.name: torch.empty(e.tensor.shape, dtype=getattr(torch, e.tensor.dtype)) for e in entries}
    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save(fakes, path)
    records = _data_records(path, entries)
    crcs: dict[str, int] = {}
    fd = os.open(path, os.O_RDWR)
    try:
        for (name, offset), (_, data) in zip(records, source(), strict=True):
            os.pwrite(fd, data, offset)
            crcs[name] = zlib.crc32(data)
        _set_crcs(fd, path, crcs)
        os.fsync(fd)
    finally:
        os.close(fd)


def _data_records(path: Path, entries: list[ExportEntry]) -> list[tuple[str, int]]:
    """(record name, offset of its bytes) of each tensor's storage, in the dict's order (torch
    numbers storages as the pickler meets them); refused if the layout is not one storage a tensor."""
    with zipfile.ZipFile(path) as z:
        infos = {i.filename: i for i in z.infolist()}
    prefix = next(n for n in infos if n.endswith("/data.pkl"))[: -len("data.pkl")]
    out = []
    with open(path, "rb") as f:
        for i, e in enumerate(entries):
            info = infos.get(f"{prefix}data/{i}")
            if info is None or info.file_size != e.tensor.nbytes or info.compress_type != zipfile.ZIP_STORED:
                raise CkptError(f"torch.save laid out {path} unexpectedly (record data/{i})", "use --format safetensors", ExitCode.FAILED)
            f.seek(info.header_offset + 26)
            name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
            out.append((info.filename, info.header_offset + 30 + name_len + extra_len))
    return out


def _set_crcs(fd: int, path: Path, crcs: dict[str, int]) -> None:
    """The CRC-32 of each record, in its local header and in the central directory."""
    with zipfile.ZipFile(path) as z:
        infos = {i.filename: i for i in z.infolist()}
        pos, end = z.start_dir, os.fstat(fd).st_size  # the central directory's offset (read by zipfile)
    for name, crc in crcs.items():
        os.pwrite(fd, crc.to_bytes(4, "little"), infos[name].header_offset + 14)
    while pos < end:
        head = os.pread(fd, 46, pos)
        if head[:4] != b"PK\x01\x02":
            break
        name_len, extra_len, comment_len = (int.from_bytes(head[i : i + 2], "little") for i in (28, 30, 32))
        name = os.pread(fd, name_len, pos + 46).decode()
        if name in crcs:
            os.pwrite(fd, crcs[name].to_bytes(4, "little"), pos + 16)
        pos += 46 + name_len + extra_len + comment_len


def _reopen(path: Path, fmt: str) -> None:
    """The written file opened by its format's own reader (safetensors: when installed), headers only."""
    try:
        if fmt == "torch":
            torch.load(path, mmap=True, weights_only=True)
            return
        try:
            from safetensors import safe_open
        except ImportError:
            return
        with safe_open(str(path), framework="pt") as f:
            list(f.keys())
    except Exception as exc:  # any failure means the file is not what was meant
        raise CkptError(
            f"{path} was written but its reader refuses it: {exc}", "report this as a bug; the checkpoint is intact", ExitCode.FAILED
        ) from exc
