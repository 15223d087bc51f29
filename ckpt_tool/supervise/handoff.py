"""What torchrun runs for each rank under ``ckpt run``: hand the rank to a pre-warmed spare.

``python -u -m ckpt_tool.supervise.handoff TRAINING_COMMAND...`` claims a spare of the node's pool
(``CKPT_WARM_POOL``, see ``supervise.warm_pool``), sends it the command line, the environment,
the working directory and the standard streams, and then stands in for it towards torchrun:
signals it gets (torchrun's SIGTERM at a teardown) are passed on, and it exits as the rank
exits (same exit status, same signal). When this launcher is killed outright (SIGKILL), the
spare kills itself. With no spare ready or warming, or a spare whose environment differs in a
way that matters (``core.handoff.env_conflicts``), it becomes the plain command (exec): a cold
start, exactly as torchrun alone would run it.

Kept light on purpose: the standard library and the pure ``core.handoff`` only (no torch).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from ckpt_tool.core.handoff import EXIT, READY, WARMING, env_conflicts

ENV_POOL = "CKPT_WARM_POOL"
WAIT_FOR_WARMING_S = 120.0  # a spare still importing is ahead of a cold start: wait for it
WAIT_FOR_STATUS_S = 10.0  # the spare maker writes a rank's exit status as soon as it reaps it
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2, signal.SIGCONT)
_LEN = struct.Struct("!I")


# ----------------------------------------------------------------------------- framing (both sides)
def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send ``message`` as one length-prefixed JSON frame, ``fds`` passed along with its first bytes
    (``SCM_RIGHTS``). Raises ``OSError`` when the other side is gone."""
    data = json.dumps(message).encode()
    head = _LEN.pack(len(data))
    if fds:
        socket.send_fds(sock, [head], fds)
    else:
        sock.sendall(head)
    sock.sendall(data)


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One message, and the descriptors that came with its first bytes.

    Raises:
        ConnectionError: the other side went away mid-message.
    """
    head, fds, _, _ = socket.recv_fds(sock, _LEN.size, max_fds) if max_fds else (sock.recv(_LEN.size), [], 0, None)
    head += _recv_exact(sock, _LEN.size - len(head))
    return json.loads(_recv_exact(sock, _LEN.unpack(head)[0])), list(fds)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed mid-message")
        out += chunk
    return out


def status_path(pool: Path, pid: int) -> Path:
    """Where the spare maker writes the exit status of the rank it runs as process ``pid``."""
    return pool / f"{pid}{EXIT}"


# ----------------------------------------------------------------------------- the launcher
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def claim(pool: Path, wait_s: float = WAIT_FOR_WARMING_S) -> socket.socket | None:
    """A connection to a ready spare (claimed by renaming its socket: one launcher per spare), or
    None when no spare is ready or still warming up within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        for ready in sorted(pool.glob(f"*{READY}")):
            taken = ready.with_suffix(".taken")
            try:
                os.rename(ready, taken)
            except OSError:
                continue  # another launcher was faster
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(taken))
                return sock
            except OSError:
                sock.close()  # the spare died after it got ready
            finally:
                taken.unlink(missing_ok=True)
        warming = [p for p in pool.glob(f"*{WARMING}") if p.stem.isdigit() and _alive(int(p.stem))]
        if not warming or time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def cold(argv: list[str]) -> NoReturn:
    """Become the training command itself (``exec``): a cold start, as plain torchrun would run it."""
    os.execv(sys.executable, [sys.executable, "-u", *argv])


def exit_as(returncode: int) -> NoReturn:
    """End this process the way the rank ended: its exit code, or the signal that killed it."""
    if returncode < 0:
        try:
            signal.signal(-returncode, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: no handler to reset
        os.kill(os.getpid(), -returncode)
        time.sleep(1)
    os._exit(returncode if returncode >= 0 else 128 - returncode)


def stand_in(pool: Path, sock: socket.socket, argv: list[str]) -> NoReturn:
    """Hand the rank to the claimed spare on ``sock`` and stand in for it: pass on signals, then exit as it
    exited. Starts cold instead when the spare's environment differs in a way that matters."""
    hello, _ = recv_frame(sock)
    conflicts = env_conflicts(hello["env"], dict(os.environ))
    if conflicts:
        why = f"the environment differs from the spare's in {', '.join(conflicts[:8])}"
        send_frame(sock, {"go": False, "why": why})
        sock.close()
        print(f"ckpt run: rank {os.environ.get('RANK', '?')} starts cold: {why}", file=sys.stderr, flush=True)
        cold(argv)
    pid = int(hello["pid"])
    pidfd = os.pidfd_open(pid)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    send_frame(sock, {"go": True, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, fds=[0, 1, 2])
    while not select.select([pidfd], [], [], 1.0)[0]:
        pass
    deadline = time.monotonic() + WAIT_FOR_STATUS_S
    while time.monotonic() < deadline:
        try:
            exit_as(int(status_path(pool, pid).read_text()))
        except (FileNotFoundError, ValueError):
            time.sleep(0.005)
    exit_as(-signal.SIGKILL)  # the pool is gone too: the status is unknown, say failure


def main(argv: list[str]) -> NoReturn:
    """The launcher's entry: a spare of ``CKPT_WARM_POOL`` takes the rank when one is ready or warming, else a
    cold start; never returns. No command: the usage on stderr, exit 2."""
    if not argv:
        print("usage: python -m ckpt_tool.supervise.handoff TRAINING_COMMAND...", file=sys.stderr)
        os._exit(2)
    pool = os.environ.get(ENV_POOL)
    sock = claim(Path(pool)) if pool else None
    if sock is None:
        cold(argv)
    stand_in(Path(pool), sock, argv)  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1:])
