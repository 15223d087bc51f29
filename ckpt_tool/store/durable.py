"""Durable filesystem primitives: fsync of files and directories, atomic replace of small files
and of whole directories."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path`` itself, so that a rename or a new name in it survives a crash. Raises
    ``OSError`` as ``os.open``/``os.fsync`` do."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_quietly(path: Path, data: bytes) -> None:
    """Readers see the old or the new content, but nothing is synced: for status files rewritten
    every few seconds, which inform and which a power cut may take back. Best effort: an error
    leaves the old file and no temp file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new content, never a mix.

    temp file in the same directory -> fsync -> rename over -> fsync the directory.
    ``mode`` is filtered by the umask like any created file.
    """
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextmanager
def directory_replaced(final: Path) -> Iterator[Path]:
    """Fill the yielded directory (``.NAME.partial`` beside ``final``, made empty); on a clean exit
    it is fsynced and renamed over ``final``, on an error removed: readers see the old directory
    or the whole new one, never half of it."""
    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
        fsync_dir(partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def append_line(path: Path, line: str, mode: int = 0o644) -> None:
    """Append one line and fsync it. A last line left without its newline (a crash mid-append)
    is ended first, so the new record never glues onto the torn one and both stay readable."""
    data = line.encode()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, mode)
    try:
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it (Linux /proc), else by a set-and-restore."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
