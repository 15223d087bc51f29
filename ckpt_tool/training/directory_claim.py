"""One job writes a checkpoint directory at a time (the decision: ``core.claim_rules``).

Rank 0 claims the directory before the first resume or save and keeps the claim alive from a
thread every ``OWNER_REFRESH_S``, whatever the training loop does (a long evaluation must not
make a live job look dead). When another job has taken the directory over, the refresh says so
once and stops; the store then refuses this job's commits (``CheckpointStore.changing``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from ckpt_tool.core.claim_rules import Owner
from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.comm import Comm

log = logging.getLogger("ckpt_tool")
OWNER_REFRESH_S = 30.0  # how often the writing job says it is alive (one small write)


class DirectoryClaim:
    """This job's claim on the checkpoint directory (``core.claim_rules`` decides): claimed by rank 0 on
    ``ensure``, then kept alive from a daemon thread until ``stop``. ``stale_after_s``: seconds without a
    refresh after which another job's claim counts as dead; ``take_over``: take the directory whatever
    its owner."""

    def __init__(self, store: CheckpointStore, comm: Comm, stale_after_s: float, take_over: bool) -> None:
        self.store, self.comm = store, comm
        self.stale_after_s, self.take_over = stale_after_s, take_over
        self.claimed = False
        self._since: float | None = None  # when rank 0 claimed the directory
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def owner(self) -> Owner:
        """This process as the owner record: SLURM job id (None outside SLURM), host, pid, since when it
        claims the directory and now (epoch seconds)."""
        now = time.time()
        return Owner(os.environ.get("SLURM_JOB_ID"), socket.gethostname(), os.getpid(), self._since or now, now)

    def ensure(self) -> None:
        """Claim the directory unless this job already holds it. Collective: rank 0 claims,
        every rank learns the outcome (a refusal is raised everywhere, exit 4)."""
        if self.claimed:
            return

        def claim() -> None:
            self._since = time.time()
            reason = self.store.claim(self.owner(), self.stale_after_s, self.take_over)
            if reason.startswith(("stale", "take-over")):
                log.warning("ckpt: taking over %s (%s)", self.store.root, reason)
            if self._thread is None:
                self._thread = threading.Thread(target=self._keep_alive, name="ckpt-owner", daemon=True)
                self._thread.start()

        self.comm.on_coordinator(claim)
        self.claimed = True

    def stop(self) -> None:
        """Stop refreshing the claim (the keep-alive thread ends at its next wake-up); the owner file is left as it is."""
        self._stop.set()

    def _keep_alive(self) -> None:
        while not self._stop.wait(OWNER_REFRESH_S):
            try:
                self.store.refresh_owner(self.owner())
            except CkptError as exc:
                log.error("ckpt: %s", exc)
                return
            except OSError as exc:  # a flaky shared filesystem must not stop training
                log.warning("ckpt: could not refresh %s: %s", self.store.root, exc)
