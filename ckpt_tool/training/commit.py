"""The distributed half of the commit protocol, shared by every writer of checkpoints.

Each rank writes its JSON state into the staging directory, collects the hashes of what it
wrote (computed while DCP wrote; anything else is read back), and the entries are gathered;
rank 0 builds the manifest, commits (manifest last, fsync, rename, LATEST, index) and applies
retention. Every rank learns the outcome.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import xxhash

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import CkptError
from ckpt_tool.store.checksums import FileDigest, binding_seed, hash_files
from ckpt_tool.store.durable import atomic_write
from ckpt_tool.store.prune import prune
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.timing import span
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.hashing_fs import HashingFileSystem


def commit_staged(
    store: CheckpointStore,
    comm: Comm,
    step: int,
    run_id: str,
    fs: HashingFileSystem,
    rank_json: bytes,
    make_manifest: Callable[[tuple[FileEntry, ...]], Manifest],
    retention: RetentionPolicy | None = None,
    facts: Mapping[str, object] | None = None,
) -> None:
    """Collective. Raises ``CkptError`` on every rank when the commit failed (the previous
    checkpoint is intact). ``facts``: more fields of the index's ``commit`` event (the save's blocked time)."""
    entries = staged_entries(store, step, run_id, fs, comm.rank, rank_json)
    commit_entries(store, comm, step, [e for es in comm.all_gather(entries) for e in es], make_manifest, retention, facts)


def staged_entries(store: CheckpointStore, step: int, run_id: str, fs: HashingFileSystem, rank: int, rank_json: bytes) -> list[FileEntry]:
    """Write ``rank``'s JSON state into the staging directory; the entries of every file of that
    rank there (see ``written_entries``)."""
    return written_entries(store.partial_path(step), step, run_id, fs, rank, rank_json, lambda name: layout.rank_of_file(name) == rank)


def written_entries(
    directory: Path, step: int, run_id: str, fs: HashingFileSystem, rank: int, rank_json: bytes, mine: Callable[[str], bool]
) -> list[FileEntry]:
    """Write ``rank``'s JSON state into ``directory`` (temp + fsync + rename); the entries of the
    files there that are ``mine``, with the hashes ``fs`` computed as DCP wrote (anything else is
    read back). Raises what failed while DCP wrote (a writer thread's error does not fail DCP's save)."""
    fs.raise_write_failure()
    state_name = layout.rank_state_name(rank)
    atomic_write(directory / state_name, rank_json)
    digests = {
        **fs.written,
        state_name: FileDigest(
            state_name, len(rank_json), xxhash.xxh3_128_hexdigest(rank_json, seed=binding_seed(run_id, step, state_name))
        ),
    }
    names = sorted(n for n in os.listdir(directory) if mine(n) or n == state_name)
    unhashed = [n for n in names if n not in digests]  # not written through DCP's stream: read back
    with span("save.hash_read_back"):
        digests.update({d.name: d for d in hash_files(directory, unhashed, run_id, step)})
    return [FileEntry(n, digests[n].bytes, digests[n].hash, rank) for n in names]


def commit_entries(
    store: CheckpointStore,
    comm: Comm,
    step: int,
    entries: list[FileEntry],
    make_manifest: Callable[[tuple[FileEntry, ...]], Manifest],
    retention: RetentionPolicy | None = None,
    facts: Mapping[str, object] | None = None,
) -> None:
    """Rank 0 commits the staged step with the files of every rank (``entries``, gathered) and
    applies retention; every rank learns the outcome (``CkptError`` on every rank)."""
    error: CkptError | None = None
    if comm.is_coordinator:
        try:
            store.commit(step, make_manifest(tuple(sorted(entries, key=lambda e: e.path))), facts)
            if retention is not None:
                prune(store, retention, known_good=step)  # hashed as it was written
        except CkptError as exc:  # keeps its hint and exit code (a directory taken over: 4)
            error = type(exc)(f"commit of step {step} failed: {exc.message}", exc.hint, exc.exit_code)  # its kind too
        except OSError as exc:
            error = CkptError(
                f"commit of step {step} failed: {exc}",
                f"the previous checkpoint is intact; check free space and permissions in {store.root}",
            )
            # kept for the saver's message (ENOSPC...): an attribute survives the broadcast, a __cause__ does not
            error.os_error = OSError(exc.errno, exc.strerror, exc.filename) if exc.errno is not None else exc  # type: ignore[attr-defined]
    error = comm.broadcast(error)
    if error is not None:
        raise error
