"""Run code as user ``nobody`` in a forked child (the tests run as root, which ignores file modes).

The interpreter lives under /root, which nobody cannot read, so the child can only use the
modules the parent already imported. Lazy imports deep in torch and its dependencies make a list
of them fragile: ``warm_up`` runs the same code as root first (on a scratch copy), which imports
everything the code path needs.
"""

from __future__ import annotations

import io
import os
import pwd
import shutil
import tempfile
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def quietly(fn: Callable[[], object]) -> None:
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        try:
            fn()
        except BaseException:  # noqa: BLE001 - only the imports matter here
            pass


def as_nobody(fn: Callable[[], object], warm_up: Callable[[], object] | None = None) -> tuple[int, str]:
    """(exit code, stdout + stderr) of ``fn()`` run as nobody; SystemExit gives the code, an
    exception the code 99 and its repr. ``warm_up`` runs first, as root, output discarded."""
    if warm_up is not None:
        quietly(warm_up)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        code = 0
        text = io.StringIO()
        try:
            nobody = pwd.getpwnam("nobody")
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with redirect_stderr(text), redirect_stdout(text):
                fn()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            code = 99
            text.write(f"Traceback: {exc!r}")
        os.write(write_fd, f"{code}\n{text.getvalue()}".encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        out = f.read()
    os.waitpid(pid, 0)
    code, _, text = out.partition("\n")
    return int(code), text


def cli_as_nobody(argv: list[str], directory: Path) -> tuple[int, str]:
    """``ckpt ARGV`` as nobody; first as root on a scratch copy of ``directory`` (the imports)."""
    from ckpt_tool.cli.main import main

    scratch = Path(tempfile.mkdtemp(prefix="ckpt-warm-"))
    try:
        shutil.copytree(directory, scratch / "d")
        quietly(lambda: main([str(scratch / "d") if a == str(directory) else a for a in argv]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return as_nobody(lambda: main(argv))
