"""Deleting old checkpoints (retention) and settling what a crash left. Part of ``CheckpointStore``.

Both only ever run under the directory's lock, and neither ever deletes the checkpoint LATEST
names nor anything quarantined.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckpt_tool.core import layout
from ckpt_tool.core.index import known_invalid
from ckpt_tool.core.recovery import Checked, Settle
from ckpt_tool.core.retention import RetentionPolicy, kept_candidates, steps_to_delete
from ckpt_tool.errors import CkptError, ConflictError, ExitCode
from ckpt_tool.store import recovery
from ckpt_tool.store.durable import fsync_dir

if TYPE_CHECKING:
    from ckpt_tool.store.store import CheckpointStore


class MaintenanceMixin:
    def _retention_plan(self: CheckpointStore, policy: RetentionPolicy, failed: set[int]) -> tuple[list[int], list[int]]:
        """(victims, kept steps that may vouch for the directory, newest first)."""
        latest = self.read_latest()  # a damaged LATEST stops retention: rollback first
        if latest is None:
            return [], []
        committed = self.committed_on_disk()
        if not steps_to_delete(committed, latest, policy):
            return [], []  # the common case after a commit: no index read
        invalid = known_invalid(self.events()) | failed
        victims = steps_to_delete(committed, latest, policy, invalid)
        return victims, kept_candidates(committed, victims, invalid)

    def apply_retention(
        self: CheckpointStore,
        policy: RetentionPolicy,
        dry_run: bool = False,
        known_good: int | None = None,
        confirm: Callable[[int], bool] | None = None,
    ) -> list[int]:
        """Delete what the policy allows, and only while a kept checkpoint is known to pass
        validation: ``known_good`` (the step just committed, hashed as it was written), or the
        newest kept one that ``confirm(step)`` validates now. A kept step that fails no longer
        counts (the caller records it invalid) and the plan is made again, so older valid steps
        are kept in its place. Without either, nothing is deleted. Each delete is renamed aside
        first, so a crash never leaves a half-deleted ``step_N``. Returns the deleted (or, with
        ``dry_run``, the deletable) steps."""
        failed: set[int] = set()
        confirmed = known_good
        while True:
            victims, candidates = self._retention_plan(policy, failed)
            if not victims or confirmed in candidates:
                break
            if confirm is None:
                raise CkptError(
                    f"no checkpoint that retention would keep in {self.root} is known to pass validation: nothing deleted",
                    "validate first (`ckpt validate --all`), then prune",
                    ExitCode.FAILED,
                )
            step = candidates[0]  # newest first; each failure changes what is kept
            if confirm(step):
                confirmed = step
            else:
                failed.add(step)
        if not victims or dry_run:
            return victims
        with self.changing():
            victims, candidates = self._retention_plan(policy, failed)
            if confirmed not in candidates:
                raise ConflictError(
                    f"{self.root} changed while pruning (a new commit or rollback): nothing deleted",
                    "run the prune again",
                    ExitCode.CONFLICT,
                )
            for step in victims:
                os.rename(self.step_path(step), self.root / layout.deleting_dir_name(step))
                self.append_event("delete", step=step, reason=f"retention: {policy.describe()}; step {confirmed} passed validation")
            fsync_dir(self.root)
        for step in victims:
            shutil.rmtree(self.root / layout.deleting_dir_name(step), ignore_errors=True)
        return victims

    def clean_up_after_crash(self: CheckpointStore, roll_forward: Callable[[int], bool] | None = None) -> list[str]:
        """Remove staging and half-deleted directories; settle the pointer (the recovery
        planner's ``Settle``, carried out by its executor, all under the directory's lock).

        - A ``step_N`` newer than a sound LATEST (a crash between rename and pointer move) is
          rolled forward when ``roll_forward(step)`` says it is valid, else quarantined.
        - A LATEST that is missing or unreadable while committed steps exist is repaired once:
          it is pointed at the newest step ``roll_forward`` accepts (newer ones that fail are
          quarantined), with the cause recorded.
        Returns a line per action.
        """

        def check(step: int) -> Checked:
            assert roll_forward is not None
            return Checked(step, roll_forward(step))

        with self.changing():
            try:
                latest, pointer_error = self.read_latest(), None
            except CkptError as exc:
                latest, pointer_error = None, exc.message
            facts = recovery.view(self, latest, pointer_error)
            decided, _ = recovery.decide(facts, Settle(can_check=roll_forward is not None), check)
            return recovery.carry_out(self, decided, locked=True)
