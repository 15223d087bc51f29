"""A DCP filesystem that hashes what it writes and checks what it reads, in the same pass.

Saving: every file DCP writes goes through a stream that feeds each written chunk to an
xxh3-128 hasher (seeded with run, step and file name, see ``store.checksums``) on its way to
disk. DCP writes each file sequentially (it only calls ``write`` and ``tell``), so the digest is
that of the file; the commit never reads the data back.

Loading: each file DCP opens is read once, whole and sequentially, its size and hash compared
with the manifest *before* any byte of it is deserialized, and DCP then reads from memory. A
damaged or substituted file raises ``CkptError`` naming it; a file the manifest does not list is
refused. One read of the data instead of two (hash pass, then load), and nothing unverified is
ever handed to ``torch.load``.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import xxhash
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.errors import CkptError, DamageError, ExitCode
from ckpt_tool.store.checksums import FileDigest, binding_seed
from ckpt_tool.timing import span

FILE_MODE = 0o644
_TMP_SUFFIX = ".tmp"  # DCP writes .metadata as .metadata.tmp, then renames it


class _HashingWriter(io.RawIOBase):
    def __init__(self, raw: io.BufferedWriter, seed: int) -> None:
        super().__init__()
        self.raw = raw
        self.hasher = xxhash.xxh3_128(seed=seed)
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.raw.write(b)  # a buffered file writes everything or raises
        self.hasher.update(b)
        self.size += n
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()


class HashingFileSystem(FileSystem):
    """``seed_for(name)`` gives the binding seed of a file; ``expected`` (load only) the manifest's entries."""

    def __init__(self, seed_for: Callable[[str], int], expected: Mapping[str, FileEntry] | None = None) -> None:
        super().__init__()
        self.seed_for = seed_for
        self.expected = expected
        self.written: dict[str, FileDigest] = {}
        # DCP's extra writer threads die with their exception and the save still returns: what
        # failed while writing a file is kept here and raised by the commit (``raise_write_failure``)
        self.write_failures: list[BaseException] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        """A stream over ``path``. Writing: created with ``FILE_MODE``, hashed as written, fsynced on close,
        its digest kept in ``written``; a failed write is recorded in ``write_failures`` and re-raised as
        the ``OSError`` behind it when there is one. Reading: checked against the manifest's entry as
        read (``CkptError`` on a mismatch or an unlisted file)."""
        path = Path(path)
        name = path.name.removesuffix(_TMP_SUFFIX)
        if "w" in mode:
            try:
                # 0o644 filtered by the umask: checkpoint data is never group- or world-writable
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
                with open(fd, mode) as raw:
                    writer = _HashingWriter(raw, self.seed_for(name))
                    yield writer
                    writer.flush()
                    with span("save.fsync"):  # after the flush: DCP's own fsync came before it (the .metadata was empty then)
                        os.fsync(raw.fileno())
            except BaseException as exc:
                os_error = _os_error_behind(exc, path)
                self.write_failures.append(os_error or exc)
                if os_error is not None and os_error is not exc:
                    # torch.save into the stream turns a failed write (ENOSPC) into "RuntimeError:
                    # unexpected pos", the OSError only its __context__, which DCP's gather of the
                    # ranks' failures drops: the OSError itself (with the file) goes to DCP instead.
                    raise os_error from exc
                raise
            self.written[path.name] = FileDigest(name, writer.size, writer.hasher.hexdigest())
        elif self.expected is not None:
            yield io.BytesIO(self.read_verified(path))
        else:
            with super().create_stream(path, mode) as stream:
                yield stream

    @contextmanager
    def writers_settled(self) -> Iterator[None]:
        """Around a DCP save through this filesystem: on the way out, also on failure, DCP's extra
        writer threads have ended (when the calling thread's file fails, DCP raises without
        joining them; removing the staging directory under them would fail them again), and a
        writer thread's failure this filesystem recorded (the commit raises it) prints no thread
        traceback. Other thread failures print as ever."""
        previous = threading.excepthook

        def hook(args: Any) -> None:
            if not any(args.exc_value is failure for failure in self.write_failures):
                previous(args)

        threading.excepthook = hook
        try:
            yield
        finally:
            for thread in threading.enumerate():
                if thread is not threading.current_thread() and thread.name.endswith("(_write_files_from_queue)"):
                    thread.join()
            threading.excepthook = previous

    def raise_write_failure(self) -> None:
        """Raise the first failure of a file written through this filesystem, if any."""
        if self.write_failures:
            raise self.write_failures[0]

    def read_verified(self, path: Path) -> bytes:
        """The whole file, after its size and hash matched the manifest."""
        entry = self.entry_for(path)
        fd = self.open_for_reading(path)
        with open(fd, "rb") as f:
            data = f.read(entry.bytes + 1)
        self.check(path, entry, len(data), xxhash.xxh3_128_hexdigest(data, seed=self.seed_for(path.name)))
        return data

    def entry_for(self, path: Path) -> FileEntry:
        """The manifest's entry for ``path``; a file it does not list is refused."""
        entry = self.expected.get(path.name) if self.expected is not None else None
        if entry is None:
            raise DamageError(
                f"{path} is not listed in the checkpoint's manifest: refused to load it", "run `ckpt validate` and `ckpt rollback`"
            )
        return entry

    @staticmethod
    def open_for_reading(path: Path) -> int:
        """A file descriptor; a file this user may not read is said to be that, not damage."""
        try:
            return os.open(path, os.O_RDONLY)
        except PermissionError:
            raise CkptError(
                f"permission denied reading {path}: it was not loaded (this is not damage)",
                "run as the user who owns the checkpoint, or ask them to grant read access",
                ExitCode.USAGE,
            ) from None

    def check(self, path: Path, entry: FileEntry, size: int, digest: str) -> None:
        """Raise ``CkptError`` (via ``mismatch``) unless ``size`` and ``digest`` are those of ``entry``."""
        if size != entry.bytes or digest != entry.hash:
            self.mismatch(path, entry, size, f"hash {digest}")

    @staticmethod
    def mismatch(path: Path, entry: FileEntry, size: int, found: str) -> None:
        """Always raises ``CkptError``: ``path`` does not match its manifest entry (``found``: what was
        found besides the size), with the rollback hint."""
        raise DamageError(
            f"{path} does not match the manifest (expected {entry.bytes} bytes, hash {entry.hash}; found {size} bytes, {found}): damaged, or copied from another step or run",
            "the checkpoint is damaged: `ckpt rollback --auto` moves to the newest good one",
        )

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        """Rename as DCP does (its temporary name to the final one), keeping the file's digest under its new name."""
        super().rename(path, new_path)
        digest = self.written.pop(Path(path).name, None)
        if digest is not None:
            self.written[Path(new_path).name] = digest


def _os_error_behind(exc: BaseException, path: Path) -> OSError | None:
    """The OSError that caused ``exc`` (itself, or in its chain), with ``path`` as its file."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            if e.filename is None and e.errno is not None:
                return OSError(e.errno, e.strerror, str(path))  # the same subclass (errno maps it)
            return e
        e = e.__cause__ or e.__context__
    return None


def verifying(manifest: Manifest, step: int) -> HashingFileSystem:
    """A filesystem that checks every file read against ``manifest``: its sizes, and its hashes seeded for its
    run and for ``step``, the step of the directory read (a manifest moved from another step does not match)."""
    return HashingFileSystem(lambda name: binding_seed(manifest.run_id, step, name), {f.path: f for f in manifest.files})


def hashing_writer(partial: Path, run_id: str, step: int, threads: int) -> tuple[FileSystemWriter, HashingFileSystem]:
    """DCP's writer for a staged checkpoint (``threads`` files per rank, fsync) through a
    ``HashingFileSystem`` that hashes every file as it is written, seeded for ``run_id``/``step``
    and fsyncs it once flushed (``create_stream``; DCP's ``sync_files`` fsyncs before the last flush)."""
    writer = FileSystemWriter(partial, single_file_per_rank=True, sync_files=False, thread_count=threads, overwrite=True)
    writer.fs = fs = HashingFileSystem(lambda name: binding_seed(run_id, step, name))
    return writer, fs
