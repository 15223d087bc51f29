"""Moving one rank's local checkpoint to another node: a byte format and a point-to-point transfer.

A copy is the files of one ``rank_R/step_N`` directory in one buffer: an 8-byte length, a JSON
header (the rank, the step, each file's name and size), then the files' bytes. No pickle on the
wire: the receiver parses JSON and slices bytes; the copy's own manifest (one of its files)
carries the hashes it is checked against before it is kept.

The transfer runs on the checkpoint manager's gloo group: each sender posts the length, then the
buffer, to each receiver (``isend``); each receiver posts the receives for the ranks that send to
it. Every rank of the group must call ``transfer`` (those with nothing to move pass empty lists).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
import torch.distributed as dist
import xxhash

from ckpt_tool.core import layout
from ckpt_tool.core.file_checks import DiskEntry, hash_problems, structure_problems
from ckpt_tool.core.local_tier import step_path
from ckpt_tool.core.manifest import Manifest, check_file_name
from ckpt_tool.errors import DamageError
from ckpt_tool.store.checksums import binding_seed
from ckpt_tool.store.durable import directory_replaced
from ckpt_tool.training.comm import Comm

_LENGTH = struct.Struct("<Q")
_SIZE_TAG, _DATA_TAG = 17, 18


def encode(directory: Path, rank: int, step: int) -> bytearray:
    """The files of ``directory`` (one rank's step) as one buffer."""
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    blobs = [(directory / name).read_bytes() for name in names]
    header = json.dumps({"rank": rank, "step": step, "files": [[n, len(b)] for n, b in zip(names, blobs, strict=True)]}).encode()
    out = bytearray(_LENGTH.pack(len(header)))
    out += header
    for blob in blobs:
        out += blob
    return out


def decode(data: bytes | bytearray | memoryview) -> tuple[int, int, dict[str, bytes]]:
    """(rank, step, {name: bytes}); ``CkptError`` for a buffer that is not a copy."""
    view = memoryview(data)
    try:
        (n,) = _LENGTH.unpack_from(view, 0)
        header = json.loads(bytes(view[_LENGTH.size : _LENGTH.size + n]))
        rank, step, listed = int(header["rank"]), int(header["step"]), header["files"]
        files, at = {}, _LENGTH.size + n
        for name, size in listed:
            if at + int(size) > len(view):
                raise ValueError(f"file {name!r} runs past the end")
            if name != layout.MANIFEST_NAME:
                check_file_name(name)
            files[name] = bytes(view[at : at + int(size)])
            at += int(size)
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise DamageError(
            f"a local checkpoint copy received from a peer is garbled ({exc})", "the copy is dropped; the sender keeps its own"
        ) from None
    return rank, step, files


def keep(root: Path, data: bytes | bytearray) -> tuple[int, int]:
    """Check a received copy against its manifest and keep it as ``root/rank_R/step_N``
    (written beside, renamed into place); returns (rank, step). A copy that does not match its
    manifest is refused (``CkptError``) and nothing is left behind."""
    rank, step, files = decode(data)
    manifest = Manifest.from_json(files.get(layout.MANIFEST_NAME, b""), f"manifest of rank {rank}'s local step {step}")
    digests = {n: xxhash.xxh3_128_hexdigest(b, seed=binding_seed(manifest.run_id, step, n)) for n, b in files.items()}
    problems = structure_problems(manifest.files, {n: DiskEntry(len(b), True) for n, b in files.items()})
    problems += hash_problems(manifest.files, digests)
    if problems:
        raise DamageError(f"rank {rank}'s local step {step} does not match its manifest: {problems[0]}", "the copy is dropped")
    with directory_replaced(Path(step_path(root, rank, step))) as partial:
        for name, blob in files.items():
            (partial / name).write_bytes(blob)
    return rank, step


def transfer(comm: Comm, sends: list[tuple[int, bytearray]], receive_from: list[int]) -> dict[int, bytearray]:
    """Send each ``(rank, buffer)`` and receive one buffer from each rank in ``receive_from``
    (collective on the manager's group; at most one buffer between two ranks per call)."""
    if not comm.distributed:
        return {}
    group = comm.group

    def peer(r: int) -> int:
        return dist.get_global_rank(group, r)

    pending = []
    for dst, data in sends:
        pending.append(dist.isend(torch.tensor([len(data)], dtype=torch.int64), peer(dst), group=group, tag=_SIZE_TAG))
        pending.append(dist.isend(torch.frombuffer(data, dtype=torch.uint8), peer(dst), group=group, tag=_DATA_TAG))
    sizes = {src: torch.zeros(1, dtype=torch.int64) for src in receive_from}
    for req in [dist.irecv(sizes[src], peer(src), group=group, tag=_SIZE_TAG) for src in receive_from]:
        req.wait()
    out = {src: bytearray(int(sizes[src].item())) for src in receive_from}
    for req in [dist.irecv(torch.frombuffer(out[src], dtype=torch.uint8), peer(src), group=group, tag=_DATA_TAG) for src in receive_from]:
        req.wait()
    for req in pending:
        req.wait()
    return out
