"""Retention carried out: deleting the old checkpoints ``core.retention.plan_prune`` names.

Used by the saver after each commit (``known_good``: the step just committed) and by
``ckpt prune`` (``confirm``: validate a kept step now). The deletes happen under the directory's
lock, after the plan is made again there; each step is renamed aside first, so a crash never
leaves a half-deleted ``step_N``. Never the step LATEST names, nothing newer, nothing quarantined.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from ckpt_tool.core import layout
from ckpt_tool.core.index import known_invalid
from ckpt_tool.core.retention import PrunePlan, RetentionPolicy, plan_prune
from ckpt_tool.errors import CkptError, ConflictError, ExitCode
from ckpt_tool.store.durable import fsync_dir
from ckpt_tool.store.store import CheckpointStore


def _plan(store: CheckpointStore, policy: RetentionPolicy, known_good: int | None, checks: dict[int, bool]) -> PrunePlan:
    latest = store.read_latest()  # a damaged LATEST stops retention: rollback first
    committed = store.committed_on_disk()
    if not plan_prune(committed, latest, policy).victims:
        return PrunePlan(())  # the common case after a commit: no index read
    return plan_prune(committed, latest, policy, known_invalid(store.events()), known_good, checks)


def prune(
    store: CheckpointStore,
    policy: RetentionPolicy,
    dry_run: bool = False,
    known_good: int | None = None,
    confirm: Callable[[int], bool] | None = None,
) -> list[int]:
    """Delete what ``policy`` allows, and only while a kept checkpoint is known to pass
    validation: ``known_good``, or the kept step ``confirm(step)`` validates now (the planner
    says which; a kept step that fails no longer counts, the caller records it invalid, and the
    plan is made again). Returns the deleted (or, with ``dry_run``, the deletable) steps.

    Raises:
        CkptError: a step would be deleted and no kept one is known to pass (exit 1).
        ConflictError: the directory changed between the plan and the deletes (exit 4).
    """
    checks: dict[int, bool] = {}
    decided = _plan(store, policy, known_good, checks)
    while decided.check is not None:
        if confirm is None:
            break
        checks[decided.check] = confirm(decided.check)
        decided = _plan(store, policy, known_good, checks)
    if not decided.victims:
        return []
    if not decided.allowed:
        raise CkptError(
            f"no checkpoint that retention would keep in {store.root} is known to pass validation: nothing deleted",
            "validate first (`ckpt validate --all`), then prune",
            ExitCode.FAILED,
        )
    if dry_run:
        return list(decided.victims)
    with store.changing():
        failed = {s: ok for s, ok in checks.items() if not ok}  # still not counted; the one that vouched still does
        again = _plan(store, policy, decided.vouched, failed)
        if not again.allowed or again.vouched != decided.vouched:
            raise ConflictError(
                f"{store.root} changed while pruning (a new commit or rollback): nothing deleted",
                "run the prune again",
                ExitCode.CONFLICT,
            )
        for step in again.victims:
            os.rename(store.step_path(step), store.root / layout.deleting_dir_name(step))
            store.append_event("delete", step=step, reason=f"retention: {policy.describe()}; step {again.vouched} passed validation")
        fsync_dir(store.root)
    for step in again.victims:
        shutil.rmtree(store.root / layout.deleting_dir_name(step), ignore_errors=True)
    return list(again.victims)
