"""The node's pool of pre-warmed spare rank processes, kept by ``ckpt run``'s watchdog.

One spare per local rank, forked by the node's spare maker (``supervise.spare_maker``, which imports
torch and the checkpoint code once): the maker starts with ``ckpt run`` itself (so that the first
ranks' imports overlap torchrun's start-up), and spares are forked again whenever the ranks of
an attempt train (a restart took them). The pool's directory holds ``<pid>.warming`` (the maker
importing), ``<pid>.sock`` (a ready spare), ``<pid>.exit`` (a spare's or rank's exit status,
written by the maker), ``<pid>.refused`` (a launcher refused a spare: the environments
differ) and ``<maker pid>.off`` (the maker found forking unsafe: a ``--warm-import`` module
started CUDA or a thread pool; it names the module). A refusal, an unsafe fork or a maker that
dies turns the pool off for the rest of the run (one ``warm_off`` event says why, and ``ckpt
run`` prints it): every rank then starts cold, as under plain torchrun.

Memory: the maker holds ~250 MB of host memory (``import torch`` alone: 223 MB RSS, measured);
its spares share those pages until they write to them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_tool.core.handoff import REFUSED, WARMING
from ckpt_tool.supervise.processes import ignore_job_signals, kill_tree
from ckpt_tool.supervise.spare_maker import OFF, untaken

__all__ = ["WarmPool"]

REQUEST_SETTLE_S = 2.0  # after asking for spares, wait this long before asking again


class WarmPool:
    """The node's spares in ``directory`` (created, 0700; it must not exist): starts the spare maker with
    ``env`` and ``imports`` at once, output to ``log``. ``off_reason`` is set, once, when the pool stops
    making spares; ``close`` ends the maker and its spares."""

    def __init__(self, directory: Path, size: int, env: Mapping[str, str], imports: tuple[str, ...], log: Path) -> None:
        directory.mkdir(mode=0o700)
        self.directory, self.size, self.log, self.env = directory, size, log, dict(env)
        self.off_reason: str | None = None  # set once: the pool stops making spares
        self._off_told = False
        self._asked_at = -REQUEST_SETTLE_S
        self._started_at: float | None = None  # when the spares now coming were asked for
        with open(log, "ab") as out:
            self.maker = subprocess.Popen(
                [sys.executable, "-u", "-m", "ckpt_tool.supervise.spare_maker", str(directory), *imports],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=ignore_job_signals,
            )
        (directory / f"{self.maker.pid}{WARMING}").touch()  # launchers wait for its imports

    # ------------------------------------------------------------------ spares
    def ready(self) -> int:
        """Spares that wait for a rank."""
        return len(untaken(self.directory))

    def fill(self) -> int:
        """Ask for spares until there is one per local rank; the number asked for."""
        self._check()
        missing = self.size - self.ready()
        if self.off_reason is not None or missing <= 0 or time.monotonic() - self._asked_at < REQUEST_SETTLE_S:
            return 0
        try:
            assert self.maker.stdin is not None
            self.maker.stdin.write(f"fill {self.size}\n".encode())
            self.maker.stdin.flush()
        except OSError as exc:
            self.off_reason = f"the spare maker does not answer ({exc}; see {self.log})"
            return 0
        self._asked_at = self._started_at = time.monotonic()
        return missing

    def _check(self) -> None:
        if self.off_reason is not None:
            return
        refused = sorted(self.directory.glob(f"*{REFUSED}"))
        unsafe = self.directory / f"{self.maker.pid}{OFF}"
        if refused:
            self.off_reason = f"a launcher refused a spare: {refused[0].read_text()}"
        elif unsafe.exists():
            self.off_reason = f"unsafe to fork: {unsafe.read_text()}"
        elif self.maker.poll() is not None:
            self.off_reason = f"the spare maker exited with status {self.maker.returncode} (see {self.log})"

    def keep(self, healthy: bool) -> list[tuple[str, dict[str, Any]]]:
        """The watchdog's turn: refill while the ranks are ``healthy`` (training); the events to
        log (spares asked for, all spares ready and how long that took, the pool turned off)."""
        events: list[tuple[str, dict[str, Any]]] = []
        started = self.fill() if healthy else 0
        self._check()
        if self.off_reason is not None and not self._off_told:
            self._off_told = True
            events.append(("warm_off", {"reason": self.off_reason, "note": "ranks start cold from now on"}))
        if started:
            events.append(("spares_started", {"count": started}))
        elif self._started_at is not None and self.ready() >= self.size:
            events.append(("spares_ready", {"count": self.ready(), "seconds": round(time.monotonic() - self._started_at, 3)}))
            self._started_at = None
        return events

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """End the maker: it kills the spares nobody took (ranks that were spares are the
        watchdog's to end) and exits once its children are gone."""
        self.off_reason = self.off_reason or "closed"
        try:
            assert self.maker.stdin is not None
            self.maker.stdin.close()
        except OSError:
            pass
        try:
            self.maker.wait(timeout=2)
        except subprocess.TimeoutExpired:  # a child it could not end: ckpt run must not wait on it
            kill_tree([self.maker.pid], 0.0)
