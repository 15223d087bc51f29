"""Which job writes a checkpoint directory: the owner record and its checks (the decision is
``core.ownership``). Part of ``CheckpointStore``."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import psutil

from ckpt_tool.core import layout
from ckpt_tool.core.ownership import Owner, decide, same_claim
from ckpt_tool.errors import ConflictError, ExitCode
from ckpt_tool.store.durable import atomic_write

if TYPE_CHECKING:
    from ckpt_tool.store.store import CheckpointStore


class OwnershipMixin:
    """``CheckpointStore``'s owner record: ``claim`` (become the directory's writer), ``refresh_owner`` and
    the check that this process still owns the directory before it changes it."""

    _claimed_as: Owner | None = None  # the claim this process made (claim())

    def claim(self: CheckpointStore, me: Owner, stale_after_s: float, take_over: bool) -> str:
        """Become the directory's writer, or raise naming the job that is (see core.ownership)."""
        with self.changing(check_owner=False):
            current = self._read_owner()
            alive = None
            if current is not None and current.host == me.host:
                alive = psutil.pid_exists(current.pid)
            decision = decide(current, me, time.time(), stale_after_s, alive, take_over)
            if not decision.allowed:
                raise ConflictError(
                    f"{self.root} is being written by {decision.reason}",
                    "two jobs must not share a checkpoint directory: wait for it, use another --ckpt-dir, or take over (take_over=True) if it is dead",
                    ExitCode.CONFLICT,
                )
            atomic_write(self.root / layout.OWNER_NAME, json.dumps(me.to_json()).encode())
            if current is None or current.pid != me.pid or current.host != me.host:
                self.append_event("owner", job_id=me.job_id, host=me.host, pid=me.pid, reason=decision.reason)
            self._claimed_as = me
            return decision.reason

    def _read_owner(self: CheckpointStore) -> Owner | None:
        """The recorded owner; None when there is none or the record is damaged."""
        try:
            return Owner.from_json(json.loads((self.root / layout.OWNER_NAME).read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def refresh_owner(self: CheckpointStore, me: Owner) -> None:
        """Say the owner is alive (``last_seen``); raises when another job took the directory over."""
        with self.changing():
            atomic_write(self.root / layout.OWNER_NAME, json.dumps(me.to_json()).encode())

    def _check_still_owner(self: CheckpointStore) -> None:
        """Under the lock: after a claim, refuse to write once another job has taken over (it
        judged this one stale, or was told to take over). No claim made here: nothing to check."""
        if self._claimed_as is None:
            return
        current = self._read_owner()  # None: removed by hand or damaged, nobody else claims it
        if current is not None and not same_claim(current, self._claimed_as):
            raise ConflictError(
                f"{self.root} was taken over by {current.describe(time.time())}; this job no longer writes there",
                "two jobs must not share a checkpoint directory: stop this one, or give it another directory",
                ExitCode.CONFLICT,
            )
