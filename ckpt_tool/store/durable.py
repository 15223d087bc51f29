"""Durable filesystem primitives: fsync of files and directories, atomic replace of small files."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
