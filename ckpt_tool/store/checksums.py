"""Content hashes of checkpoint files: xxh3-128, seeded with the run, the step and the file name.

The seed binds each file to its place: a shard copied in from another step or run (valid bytes,
wrong place) no longer matches its manifest entry, even if the manifest line is copied with it.
Files are read in fixed-size chunks into one reused buffer per thread: memory stays bounded
whatever the checkpoint's size. xxhash releases the GIL, so several files hash in parallel.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import xxhash

CHUNK_BYTES = 8 << 20


def binding_seed(run_id: str, step: int, name: str) -> int:
    """The hash seed that binds a file to ``run_id``, ``step`` and its ``name``: the same bytes elsewhere hash
    differently."""
    return xxhash.xxh3_64_intdigest(f"{run_id}\0{step}\0{name}".encode())


@dataclass(frozen=True)
class FileDigest:
    """One file's manifest entry: its name, its size in bytes and its xxh3-128 hex digest."""

    name: str
    bytes: int
    hash: str


def hash_file(path: Path, seed: int, on_bytes: Callable[[int], None] | None = None) -> FileDigest:
    """Hash ``path`` with ``seed`` in ``CHUNK_BYTES`` chunks, calling ``on_bytes`` with each chunk's size (for
    progress); returns the digest of the bytes read. Raises ``OSError`` from reading."""
    hasher = xxhash.xxh3_128(seed=seed)
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            hasher.update(view[:n])
            total += n
            if on_bytes is not None:
                on_bytes(n)
    return FileDigest(path.name, total, hasher.hexdigest())


def hash_files(
    directory: Path,
    names: Iterable[str],
    run_id: str,
    step: int,
    threads: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_error: Callable[[str, OSError], None] | None = None,
) -> list[FileDigest]:
    """Hash ``names`` inside ``directory`` in parallel; result in the order of ``names``. With
    ``on_error``, a file that cannot be read is reported there and left out, not raised."""
    names = list(names)
    if not names:
        return []

    def one(name: str) -> FileDigest | None:
        try:
            return hash_file(directory / name, binding_seed(run_id, step, name), on_bytes)
        except OSError as exc:
            if on_error is None:
                raise
            on_error(name, exc)
            return None

    workers = max(1, min(len(names), threads or min(8, (os.cpu_count() or 2))))
    with ThreadPoolExecutor(workers, thread_name_prefix="ckpt-hash") as pool:
        return [d for d in pool.map(one, names) if d is not None]
