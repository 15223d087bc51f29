"""The watchdogs' line to each other: is a peer node reachable, and how fast is the link to it.

Each node's ``ckpt run`` listens on a TCP port (``PeerLinks``; its ``HOST:PORT`` is advertised in
``ranks.NODE.json``, the host as its peers resolve it). Two uses:

- **reach** (at a hang): a connect to every other node's listener, 1 s timeout, all at once;
  what each node reached goes beside the hang's stacks (``reach.NODE.json``) and names a node
  cut off the network (``core.hang_report.cut_off``);
- **link checks** (while the ranks train, every ``LINK_EVERY_S``): ``LINK_BYTES`` sent to each
  peer's listener and acknowledged, timed; each node's rates go to ``links.NODE.json``, and a
  node whose links carry a fraction of what the others' do is on a slow link
  (``core.stragglers.slow_links``), which no rank's compute time shows. The check runs in a
  thread of its own; ~256 KiB per peer every 10 s.
"""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_tool.core.stragglers import SLOW_LINK_CHECKS, slow_links
from ckpt_tool.supervise.run_dir import read_links, read_probes, write_links

PROBE_TIMEOUT_S = 1.0
LINK_EVERY_S = 10.0
LINK_BYTES = 256 * 1024
LINK_TIMEOUT_S = 20.0
_LEN = struct.Struct("!Q")


class PeerLinks:
    """This node's listener: answers reach probes (a connect) and link checks (reads the bytes
    sent, acknowledges with one byte), each connection in a thread of its own."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self._closed = False
        threading.Thread(target=self._serve, name="ckpt-peer-links", daemon=True).start()

    @property
    def address(self) -> str:
        """``HOST:PORT`` where peers reach this listener (the host's name, as peers resolve it)."""
        return f"{socket.gethostname()}:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=_answer, args=(conn,), daemon=True).start()

    def close(self) -> None:
        """Stop listening."""
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _answer(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(LINK_TIMEOUT_S)
        try:
            head = _recv_exact(conn, _LEN.size)
            if head is None:
                return  # a reach probe: the connect was the question
            if _recv_exact(conn, _LEN.unpack(head)[0]) is not None:
                conn.sendall(b"k")
        except OSError:
            return


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = conn.recv(min(n - got, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _each_peer(peers: Mapping[str, str], one: Any) -> dict[str, Any]:
    if not peers:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(peers))) as pool:
        return dict(zip(peers, pool.map(one, peers.values()), strict=True))


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def reach(peers: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, bool]:
    """Whether each peer's listener (node -> ``HOST:PORT``) accepts a TCP connection within ``timeout_s``."""

    def one(address: str) -> bool:
        try:
            with socket.create_connection(_split(address), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            return False

    return _each_peer(peers, one)


def link_rates(peers: Mapping[str, str], nbytes: int = LINK_BYTES, timeout_s: float = LINK_TIMEOUT_S) -> dict[str, float]:
    """Bytes per second sent to each peer's listener and acknowledged (0.0: it failed)."""
    payload = bytes(nbytes)

    def one(address: str) -> float:
        try:
            with socket.create_connection(_split(address), timeout=timeout_s) as conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                t0 = time.perf_counter()
                conn.sendall(_LEN.pack(nbytes) + payload)
                if conn.recv(1) != b"k":
                    return 0.0
                return nbytes / max(time.perf_counter() - t0, 1e-6)
        except (OSError, ValueError):
            return 0.0

    return _each_peer(peers, one)


class LinkCheck:
    """The link checks of one node's watchdog: ``poll`` starts one every ``every_s`` while the
    ranks train (in a thread), writes its rates, and returns ``slow_link`` findings for this node
    once it was slow in ``SLOW_LINK_CHECKS`` checks in a row (once per round)."""

    def __init__(self, run_dir: Path, node: str, round_id: str, every_s: float = LINK_EVERY_S) -> None:
        self.run_dir, self.node, self.round_id, self.every_s = run_dir, node, round_id, every_s
        self._started = time.monotonic()
        self._thread: threading.Thread | None = None
        self._checked = 0  # checks whose rates this node has judged
        self._done = 0  # checks this node has finished
        self._slow_in_a_row = 0
        self.reported = False

    def poll(self, now: float, training: bool) -> list[tuple[str, dict[str, Any]]]:
        """Start a check when one is due; judge the rates of the last one that finished."""
        if training and self._thread is None and now - self._started >= self.every_s:
            self._started = now
            self._thread = threading.Thread(target=self._check, name="ckpt-link-check", daemon=True)
            self._thread.start()
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
        if self._done == self._checked:
            return []
        self._checked = self._done
        rates = read_links(self.run_dir, self.round_id, time.time() - 3 * self.every_s)
        slow = slow_links(rates)
        self._slow_in_a_row = self._slow_in_a_row + 1 if self.node in slow else 0
        if self._slow_in_a_row < SLOW_LINK_CHECKS or self.reported:
            return []
        self.reported = True
        mine = {f"to {b}": round(v / 1e6, 3) for b, v in rates.get(self.node, {}).items()}
        mine |= {f"from {a}": round(r[self.node] / 1e6, 3) for a, r in rates.items() if self.node in r}
        others = {f"{a}->{b}": round(v / 1e6, 3) for a, r in rates.items() for b, v in r.items() if self.node not in (a, b)}
        note = "this node's link carries a fraction of the others': every rank's collectives wait for it (a straggler of the network, not of compute)"
        return [("slow_link", {"share": slow[self.node], "mb_s": mine, "others_mb_s": others, "checks": self._slow_in_a_row, "note": note})]

    def _check(self) -> None:
        try:
            peers = {n: a for n, a in read_probes(self.run_dir, self.round_id).items() if n != self.node}
            if peers:
                write_links(self.run_dir, self.node, self.round_id, link_rates(peers))
        except OSError:
            pass
        finally:
            self._done += 1
