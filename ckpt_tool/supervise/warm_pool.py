"""The node's pool of pre-warmed spare rank processes, kept by ``ckpt run``'s watchdog.

One spare per local rank (``supervise.warm_rank``): started with ``ckpt run`` itself (so that the
first ranks import torch while torchrun starts up), and again whenever the ranks of an attempt
train (a restart took the spares). A spare is the watchdog's child: a thread per spare reaps it
and writes its exit status where the rank's launcher (``supervise.handoff``) waits for it.
The pool's directory holds ``<pid>.warming`` (importing), ``<pid>.sock`` (ready), ``<pid>.exit``
(status) and ``<pid>.refused`` (a launcher refused it: its environment differs); a refused
spare or one that dies while warming turns the pool off for the rest of the run (one event
says why): every rank then starts cold, as under plain torchrun.

Memory: a spare with torch imported holds ~250 MB of host memory (measured: 223 MB RSS for
``import torch`` alone) until it is used or ``ckpt run`` ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_tool.supervise.handoff import status_path
from ckpt_tool.supervise.processes import ignore_usr1
from ckpt_tool.supervise.warm_rank import REFUSED_SUFFIX

__all__ = ["WarmPool"]


class WarmPool:
    def __init__(self, directory: Path, size: int, env: Mapping[str, str], imports: tuple[str, ...], log: Path) -> None:
        directory.mkdir(mode=0o700)
        self.directory, self.size, self.env, self.imports, self.log = directory, size, dict(env), imports, log
        self.procs: dict[int, subprocess.Popen] = {}
        self.off_reason: str | None = None  # set once: the pool stops making spares
        self._off_told = False
        self._started_at: float | None = None  # when the spares now warming were started
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ spares
    def spares(self) -> list[int]:
        """Spares not yet taken: alive and warming or ready."""
        names = {p.name for p in self.directory.iterdir()}
        return [pid for pid, proc in self.procs.items() if proc.poll() is None and ({f"{pid}.warming", f"{pid}.sock"} & names)]

    def ready(self) -> int:
        """Spares that finished importing and wait for a rank."""
        return len([p for p in self.directory.glob("*.sock") if p.stem.isdigit() and int(p.stem) in self.procs])

    def fill(self) -> int:
        """Start spares until there is one per local rank; the number started."""
        started = 0
        while self.off_reason is None and len(self.spares()) < self.size:
            self._spawn()
            started += 1
        if started:
            self._started_at = time.monotonic()
        return started

    def keep(self, healthy: bool) -> list[tuple[str, dict[str, Any]]]:
        """The watchdog's turn: refill while the ranks are ``healthy`` (training); the events to
        log (spares started, all spares ready and how long they took, the pool turned off)."""
        events: list[tuple[str, dict[str, Any]]] = []
        if self.off_reason is not None and not self._off_told:
            self._off_told = True
            events.append(("warm_off", {"reason": self.off_reason, "note": "ranks start cold from now on"}))
        started = self.fill() if healthy else 0
        if started:
            events.append(("spares_started", {"count": started}))
        elif self._started_at is not None and self.ready() >= self.size:
            events.append(("spares_ready", {"count": self.ready(), "seconds": round(time.monotonic() - self._started_at, 2)}))
            self._started_at = None
        return events

    def _spawn(self) -> None:
        argv = [sys.executable, "-u", "-m", "ckpt_tool.supervise.warm_rank", str(self.directory), *self.imports]
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, preexec_fn=ignore_usr1
            )
        (self.directory / f"{proc.pid}.warming").touch()
        self.procs[proc.pid] = proc
        threading.Thread(target=self._reap, args=(proc,), daemon=True, name=f"ckpt-spare-{proc.pid}").start()

    def _reap(self, proc: subprocess.Popen) -> None:
        """Wait for a spare (or the rank it became); publish its status for its launcher."""
        code = proc.wait()
        status = status_path(self.directory, proc.pid)
        partial = status.with_suffix(".partial")
        partial.write_text(str(code))
        os.replace(partial, status)  # the launcher never reads half a number
        refused = self.directory / f"{proc.pid}{REFUSED_SUFFIX}"
        warming = self.directory / f"{proc.pid}.warming"
        with self._lock:
            if refused.exists():
                self._turn_off(f"a launcher refused a spare: {refused.read_text()}")
            elif warming.exists():
                self._turn_off(f"a spare exited with status {code} while importing (see {self.log})")
        warming.unlink(missing_ok=True)
        (self.directory / f"{proc.pid}.sock").unlink(missing_ok=True)

    def _turn_off(self, reason: str) -> None:
        if self.off_reason is None:
            self.off_reason = reason

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Kill the spares nobody took (ranks that were spares are the watchdog's to end)."""
        self.off_reason = self.off_reason or "closed"
        for pid in self.spares():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
