"""A spare rank process: forked by the spare maker (``supervise.spare_maker``) with torch and the
checkpoint code already imported, it waits for a rank that torchrun starts (``supervise.handoff``)
and runs the training command as ``__main__``, as ``python -u`` would.

It listens on ``POOL_DIR/<pid>.sock`` and exits when the spare maker is gone. At the takeover it
adopts the rank's standard streams, working directory and environment, applies
``OMP_NUM_THREADS`` (read by the OpenMP runtime when torch loaded) with ``torch.set_num_threads``,
shows the rank's command in ``ps``, and kills itself if the launcher dies. When the script ends
it runs the ``atexit`` handlers, closes the open files of module globals and leaves without the
interpreter's module teardown (about a second with torch loaded, measured): the rank is gone as
soon as its work is.
"""

from __future__ import annotations

import atexit
import io
import os
import runpy
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ckpt_tool.core.handoff import READY, REFUSED, WARM_MARKER, process_title, script_of, threads_to_apply
from ckpt_tool.supervise.handoff import recv_frame, send_frame

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch._dynamo",  # imported lazily by fully_shard (torch._compile.disable): 1.1 s, measured
    "torch.nn.functional",
    "torch.optim",
    "ckpt_tool.training.manager",
    "ckpt_tool.training.distributed",
    "ckpt_tool.training.mesh",
    "ckpt_tool.training.grad_norm",
)


def _title_setter() -> Callable[[str], None] | None:
    """setproctitle, set up in the spare before the takeover rewrites the environment (the title
    takes the memory of argv and of the environment after it: ``/proc/PID/environ`` then reads
    empty, so never in ``ckpt run``'s own process)."""
    try:
        import setproctitle
    except ImportError:  # pragma: no cover - a dependency; ps then shows the spare's own command
        return None
    setproctitle.getproctitle()
    return setproctitle.setproctitle


def wait_for_launcher(pool: Path, parent: int, ready: int) -> socket.socket:
    """Listen on ``POOL/<pid>.sock`` (a ready spare), accept one launcher; exit when the parent
    (the spare maker) is gone."""
    me = os.getpid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(pool / f"{me}{READY}"))
    listener.listen(1)
    os.write(ready, b"1")  # tell the spare maker
    os.close(ready)
    while not select.select([listener], [], [], 1.0)[0]:
        if os.getppid() != parent:
            os._exit(0)  # the spare maker is gone: so is ckpt run
    conn, _ = listener.accept()
    listener.close()
    return conn


def _die_with_launcher(conn: socket.socket) -> None:
    """The launcher holds the other end: when it dies (SIGKILL from torchrun or ``ckpt run``),
    this rank must not live on unseen."""
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def take_over(conn: socket.socket, message: dict[str, Any], fds: list[int], set_title: Callable[[str], None] | None) -> list[str]:
    """Become the rank: its streams, directory, environment, thread count and title."""
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(message["env"])
    os.environ[WARM_MARKER] = "1"
    threads = threads_to_apply(os.environ)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if set_title is not None:
        set_title(process_title(sys.executable, message["argv"]))
    threading.Thread(target=_die_with_launcher, args=(conn,), daemon=True, name="ckpt-launcher-watch").start()
    return list(message["argv"])


def run_command(argv: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """Run the training command as ``__main__``: its exit status as ``python`` would give it, and
    the script's global namespaces (where a file opened at its top level lives)."""
    kind, target, args = script_of(argv)
    sys.argv = [target, *args]
    try:
        if kind == "module":
            sys.path[0] = os.getcwd()
            return 0, [runpy.run_module(target, run_name="__main__", alter_sys=True)]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        return 0, [runpy.run_path(target, run_name="__main__")]
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0, _globals_of(exc)
        print(exc.code, file=sys.stderr)
        return 1, _globals_of(exc)
    except BaseException as exc:  # noqa: BLE001 - reported as the interpreter would, then exit 1
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1, _globals_of(exc)


def _globals_of(exc: BaseException) -> list[dict[str, Any]]:
    out, tb = [], exc.__traceback__
    while tb is not None:
        out.append(tb.tb_frame.f_globals)
        tb = tb.tb_next
    return out


def open_files(namespaces: list[dict[str, Any]]) -> list[io.IOBase]:
    """The open file objects in the globals of every module and of the script: what the module
    teardown would have closed (walking every object the garbage collector tracks instead took
    1.1 s after training, measured; module globals take ~50 ms)."""
    is_file: dict[type, bool] = {}
    out = []
    for namespace in [*(vars(m) for m in list(sys.modules.values()) if hasattr(m, "__dict__")), *namespaces]:
        for value in list(namespace.values()):
            kind = type(value)
            known = is_file.get(kind)
            if known is None:
                known = is_file[kind] = issubclass(kind, io.IOBase)
            if known and not value.closed:
                out.append(value)
    return out


def finish_files(namespaces: list[dict[str, Any]]) -> None:
    """What the finalizers would do at shutdown: close those files (buffers flushed, a gzip
    trailer written); the standard streams, at every layer, are only flushed."""
    for f in open_files(namespaces):
        try:
            fd = f.fileno()
        except (OSError, ValueError):
            continue  # in memory (BytesIO, StringIO): nothing to lose
        try:
            f.flush() if fd in (0, 1, 2) else f.close()
        except Exception:  # noqa: BLE001 - a file that cannot flush (closed pipe), as at shutdown
            pass


def leave(code: int, namespaces: list[dict[str, Any]]) -> NoReturn:
    """Python's shutdown without the module teardown (about a second with torch loaded): the
    atexit handlers, then ``finish_files``, then ``os._exit``. (Files held only by other objects
    are left to the operating system, as Python's own shutdown may leave them.)"""
    try:
        atexit._run_exitfuncs()
        finish_files(namespaces)
    finally:
        os._exit(code & 0xFF)


def serve(pool: Path, maker: int, spawned_with: dict[str, str], ready: int) -> NoReturn:
    """A spare's life, in a process forked by the spare maker (``supervise.spare_maker``): wait for a
    launcher, take its rank over (or be refused), run the rank, leave."""
    set_title = _title_setter()
    conn = wait_for_launcher(pool, maker, ready)
    try:
        message, fds = recv_or_refuse(conn, spawned_with)
    except (OSError, ValueError, KeyError):
        os._exit(0)  # the launcher died before it said what to run
    if not message.get("go"):
        (pool / f"{os.getpid()}{REFUSED}").write_text(str(message.get("why", "refused")))
        os._exit(0)
    leave(*run_command(take_over(conn, message, fds, set_title)))


def recv_or_refuse(conn: socket.socket, env: dict[str, str]) -> tuple[dict[str, Any], list[int]]:
    """Say who this spare is and what it imported under; the launcher answers go (with the
    rank's command, environment and streams) or no (why)."""
    send_frame(conn, {"pid": os.getpid(), "env": env})
    return recv_frame(conn, max_fds=3)
