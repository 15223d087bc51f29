"""The node-local heartbeat channel: Unix datagram sockets in a private directory under /tmp.

Ranks send small JSON datagrams (beats) to the supervisor's socket; the supervisor sends control
messages (``save_and_stop``) to each rank's own socket, whose address the rank gives in its
beats. Nothing travels over the shared filesystem or the network; a beat costs one ``sendto``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

ENV_SOCKET = "CKPT_HEARTBEAT_SOCKET"
MAX_DATAGRAM = 4096


def encode(message: dict[str, Any]) -> bytes:
    """A message as compact JSON bytes (one datagram)."""
    return json.dumps(message, separators=(",", ":")).encode()


def decode(raw: bytes) -> dict[str, Any] | None:
    """The message in a datagram; None for anything that is not a JSON object (never raises)."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def bind(path: Path) -> socket.socket:
    """A non-blocking Unix datagram socket bound at ``path`` (a stale socket file there is replaced),
    readable and writable by this user only (0600)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path.unlink(missing_ok=True)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.setblocking(False)
    return sock


def send(sock: socket.socket, path: str | Path, message: dict[str, Any]) -> bool:
    """Best effort: a full queue or a vanished peer never blocks or fails the sender."""
    try:
        sock.sendto(encode(message), str(path))
        return True
    except (BlockingIOError, FileNotFoundError, ConnectionRefusedError, OSError):
        return False


def receive_all(sock: socket.socket) -> list[dict[str, Any]]:
    """Every message waiting on ``sock``, oldest first, without blocking; datagrams that are not messages are dropped."""
    out = []
    while True:
        try:
            raw = sock.recv(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return out
        message = decode(raw)
        if message is not None:
            out.append(message)
