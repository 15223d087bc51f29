"""The recovery executor: reads what the planner needs, checks the steps it asks about, carries out its plan.

The one place a recovery decision (``ckpt_tool.core.recovery.plan``) touches the disk, for
``ckpt recover``, ``ckpt rollback``, the crash clean-up (``clean_up_after_crash``) and the ranks'
resume alike. Actions are carried out under the directory's lock, in the plan's order, through the
store's public surface (``changing``, ``quarantine_locked``, ``write_latest_locked``,
``set_latest_locked``, ``append_event``); quarantine moves, never deletes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from ckpt_tool.core import layout
from ckpt_tool.core.recovery import (
    RECOVER_NAME,
    Checked,
    Intent,
    MoveLatest,
    Quarantine,
    Recorded,
    RecoveryPlan,
    Remove,
    Settle,
    StoreView,
    plan,
)
from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.timing import span

Check = Callable[[int], Checked]


def view(store: CheckpointStore, latest: int | None = None, latest_problem: str | None = None) -> StoreView:
    """The directory's facts: one listing (committed steps, every step directory, leftovers),
    with LATEST as the caller read it (each path states its problem in its own words)."""
    entries = sorted(store.entries(), key=lambda e: e.step)
    steps = [e for e in entries if e.kind is layout.EntryKind.STEP]
    return StoreView(
        committed=tuple(e.step for e in steps if (store.root / e.name / layout.MANIFEST_NAME).is_file()),
        step_dirs=tuple(e.step for e in steps),
        latest=latest,
        latest_problem=latest_problem,
        leftovers=tuple((e.name, e.kind.value) for e in entries if e.kind in (layout.EntryKind.PARTIAL, layout.EntryKind.DELETING)),
    )


def decide(facts: StoreView, intent: Intent, check: Check | None = None) -> tuple[RecoveryPlan, dict[int, Checked]]:
    """Plan, checking each step the planner asks about with ``check``, until the plan is final.
    Returns the plan and every check made (in the order made)."""
    checks: dict[int, Checked] = {}
    while True:
        decided = plan(facts, intent, checks)
        if decided.check is None:
            return decided, checks
        if check is None:
            raise AssertionError(f"the recovery plan needs step {decided.check} checked and no check was given")
        checks[decided.check] = check(decided.check)


def carry_out(store: CheckpointStore, decided: RecoveryPlan, locked: bool = False) -> list[str]:
    """Carry out ``decided``'s actions in order, under the directory's lock (``locked``: the
    caller holds it). Returns the plan's line per action."""
    if not locked:
        with store.changing():
            return carry_out(store, decided, locked=True)
    with span("recovery.carry_out"):
        for action in decided.actions:
            if isinstance(action, Remove):
                shutil.rmtree(store.root / action.name, ignore_errors=True)
                store.append_event("cleanup", name=action.name, reason=f"{action.kind} directory left by a crash")
            elif isinstance(action, Quarantine):
                store.quarantine_locked(action.step, action.reason)
            elif isinstance(action, MoveLatest):
                _move_latest(store, action)
    return decided.lines


def clean_up_after_crash(store: CheckpointStore, roll_forward: Callable[[int], bool] | None = None) -> list[str]:
    """Remove staging and half-deleted directories; settle the pointer (the planner's ``Settle``),
    all under the directory's lock.

    - A ``step_N`` newer than a sound LATEST (a crash between rename and pointer move) is
      rolled forward when ``roll_forward(step)`` says it is valid, else quarantined.
    - A LATEST that is missing or unreadable while committed steps exist is repaired once:
      it is pointed at the newest step ``roll_forward`` accepts (newer ones that fail are
      quarantined), with the cause recorded.
    Without ``roll_forward`` nothing newer than LATEST is trusted. Returns a line per action.
    """

    def check(step: int) -> Checked:
        assert roll_forward is not None
        return Checked(step, roll_forward(step))

    with store.changing():
        latest, pointer_error = store.read_latest_or_problem()
        decided, _ = decide(view(store, latest, pointer_error), Settle(can_check=roll_forward is not None), check)
        return carry_out(store, decided, locked=True)


def _move_latest(store: CheckpointStore, move: MoveLatest) -> None:
    if move.event == "repair_latest":
        store.write_latest_locked(move.step)
        store.append_event("repair_latest", step=move.step, reason=move.reason)
    elif move.event == "roll_forward":
        store.write_latest_locked(move.step)
        store.append_event("roll_forward", step=move.step, previous=move.previous)
    else:
        store.set_latest_locked(move.step, move.reason, move.event)


def identity(store: CheckpointStore) -> tuple[str, str | None]:
    """What makes a recorded decision current on ``store``: its resolved path and a fingerprint
    of the facts the planner judged (the step directories, committed or not, the leftovers of a
    crash, LATEST's step and its manifest's bytes: a commit, rollback, quarantine, clean-up,
    deletion or rewritten manifest changes it; taking the directory over does not). None: no
    LATEST to fingerprint."""
    try:
        latest = store.read_latest()
        manifest = (store.step_path(latest) / layout.MANIFEST_NAME).read_bytes() if latest is not None else None
    except (CkptError, OSError):
        latest, manifest = None, None
    if latest is None or manifest is None:
        return str(store.root.resolve()), None
    facts = view(store, latest)
    digest = hashlib.sha256(repr((facts.committed, facts.step_dirs, facts.leftovers, latest)).encode())
    digest.update(manifest)
    return str(store.root.resolve()), digest.hexdigest()[:32]


def read_recorded(run_dir: Path) -> Recorded | None:
    """``ckpt recover``'s decision in ``run_dir`` (``recover.json``), or None: no file, not
    readable, torn, or not a decision to resume from."""
    try:
        data = json.loads((run_dir / RECOVER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Recorded.from_json(data)
