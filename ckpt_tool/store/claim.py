"""The claim on a checkpoint directory: which job writes it (``DIR/.owner.json``), composed into
``CheckpointStore`` as ``store.owner``.

The decision who may write is ``core.claim_rules``'s; this record reads and writes the owner file,
remembers the claim this process made, and tells the store's ``changing()`` when another job
has taken the directory over since. It takes no lock itself: the store calls it under its lock.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ckpt_tool.core import layout
from ckpt_tool.core.claim_rules import Owner, decide, same_claim
from ckpt_tool.errors import ConflictError, ExitCode
from ckpt_tool.store.durable import atomic_write


@dataclass(frozen=True)
class Claimed:
    """A claim made: why it was allowed, and whether the directory changed hands (a new job,
    host or process: the store records an ``owner`` event then)."""

    reason: str
    changed_hands: bool


class OwnerRecord:
    """``root``'s owner file and the claim this process made on it (``claimed_as``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / layout.OWNER_NAME
        self.claimed_as: Owner | None = None

    def read(self) -> Owner | None:
        """The recorded owner; None when there is none or the record is damaged."""
        try:
            return Owner.from_json(json.loads(self.path.read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def take(self, me: Owner, stale_after_s: float, take_over: bool) -> Claimed:
        """Under the directory's lock: become its writer, or raise naming the job that is.

        Raises:
            ConflictError: a live job owns the directory (exit 4).
        """
        current = self.read()
        alive = psutil.pid_exists(current.pid) if current is not None and current.host == me.host else None
        decision = decide(current, me, time.time(), stale_after_s, alive, take_over)
        if not decision.allowed:
            raise ConflictError(
                f"{self.root} is being written by {decision.reason}",
                "two jobs must not share a checkpoint directory: wait for it, use another --ckpt-dir, or take over (take_over=True) if it is dead",
                ExitCode.CONFLICT,
            )
        self.write(me)
        self.claimed_as = me
        return Claimed(decision.reason, current is None or current.pid != me.pid or current.host != me.host)

    def write(self, me: Owner) -> None:
        """Record ``me`` as the owner (atomic): the claim, or a refresh of ``last_seen``."""
        atomic_write(self.path, json.dumps(me.to_json()).encode())

    def check_still_ours(self) -> None:
        """Under the lock: after a claim, refuse to write once another job has taken over (it
        judged this one stale, or was told to take over). No claim made here: nothing to check.

        Raises:
            ConflictError: another job owns the directory now (exit 4).
        """
        if self.claimed_as is None:
            return
        current = self.read()  # None: removed by hand or damaged, nobody else claims it
        if current is not None and not same_claim(current, self.claimed_as):
            raise ConflictError(
                f"{self.root} was taken over by {current.describe(time.time())}; this job no longer writes there",
                "two jobs must not share a checkpoint directory: stop this one, or give it another directory",
                ExitCode.CONFLICT,
            )
