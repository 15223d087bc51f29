"""The recovery planner: which checkpoint to resume from, what to quarantine, how LATEST moves. Pure.

Every recovery path asks it the same way: the facts of the directory (``StoreView``), what was
asked (``Settle`` after a crash, ``Rollback``, ``Resume``, ``Damaged``) and the checks made so
far go in; one ``RecoveryPlan`` comes out. A plan that needs a step judged first says so
(``check``): the executor (``ckpt_tool.store.recovery``) checks that step and plans again, so
the order in which steps are checked is the planner's too. The executor carries out the plan's
``actions`` in order; nothing here reads or writes the disk.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ckpt_tool.core import layout


def fallback_step(committed: Iterable[int], below: int | None) -> int | None:
    """The newest committed step strictly older than ``below`` (the newest of all when None)."""
    candidates = [s for s in committed if below is None or s < below]
    return max(candidates) if candidates else None


def steps_to_quarantine_on_rollback(committed: Iterable[int], latest: int | None, target: int) -> list[int]:
    """Rolling back to ``target`` quarantines every committed step after it up to LATEST
    (all of them when LATEST is unknown): they are what the user judged bad."""
    return sorted(s for s in committed if s > target and (latest is None or s <= latest))


# ------------------------------------------------------------------ facts in
@dataclass(frozen=True)
class StoreView:
    """What the directory says, read once by the executor.

    ``latest``: the step LATEST names (None: missing or unreadable). ``latest_problem``: why
    LATEST cannot be trusted, in the store's words (None: it can). ``leftovers``: staging and
    half-deleted directories a crash left, as (name, kind) with kind ``partial``/``deleting``.
    """

    committed: tuple[int, ...]  # step directories with a manifest, oldest first
    step_dirs: tuple[int, ...] = ()  # every step_N directory, committed or not, oldest first
    latest: int | None = None
    latest_problem: str | None = None
    leftovers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Checked:
    """One step judged by the executor's check (validate, verify): passed or not, and why not."""

    step: int
    ok: bool
    problems: tuple[str, ...] = ()


# ------------------------------------------------------------------ what is asked
@dataclass(frozen=True)
class Settle:
    """After a crash, before anything else: remove the leftovers, roll LATEST forward onto a
    valid newer step (or quarantine it), repair a LATEST that is missing or unreadable.
    ``can_check=False``: no check is available, so nothing newer than LATEST is trusted."""

    can_check: bool = True


@dataclass(frozen=True)
class Rollback:
    """Move LATEST back: to ``to``; with ``auto`` to the newest step up to LATEST that passes;
    else to the newest older than LATEST that passes. What comes after the target up to LATEST
    is quarantined with ``reason``."""

    to: int | None = None
    auto: bool = False
    reason: str = "manual rollback"


@dataclass(frozen=True)
class Resume:
    """The ranks' first candidate: LATEST when it names a committed step, else the newest
    committed one (LATEST moved there, for the reason ``latest_problem`` gives)."""


@dataclass(frozen=True)
class Damaged:
    """``step`` failed what the ranks check as they load it: quarantine it, LATEST back one."""

    step: int
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Start:
    """``ckpt recover`` at a job's start, after the crash clean-up: LATEST when it passes the
    start's check, else a rollback to the newest older step that passes (what comes after it
    quarantined). The start's check of LATEST and a rollback's check of older steps may differ:
    the executor's check is asked each step in turn."""


Intent = Settle | Rollback | Resume | Damaged | Start


# ------------------------------------------------------------------ plan out
@dataclass(frozen=True)
class Remove:
    """Delete a leftover of a crash (never a committed step)."""

    name: str
    kind: str  # "partial" | "deleting"

    @property
    def says(self) -> str:
        """The line ``ckpt recover`` and the resume's log show for it."""
        return f"removed {self.name} (left by a crash)"


@dataclass(frozen=True)
class Quarantine:
    """Move ``step`` aside into quarantine/ (never delete it), recording ``reason``."""

    step: int
    reason: str
    says: str = ""


@dataclass(frozen=True)
class MoveLatest:
    """Point LATEST at ``step``; ``event`` is what the index records: ``rollback`` (with the
    previous step and ``reason``), ``roll_forward`` (with ``previous``) or ``repair_latest``
    (with ``reason``)."""

    step: int
    reason: str
    event: str = "rollback"
    previous: int | None = None
    says: str = ""


Action = Remove | Quarantine | MoveLatest


class Refusal(enum.Enum):
    """Why a rollback has nowhere to go; the executor says it in the user's words (with the
    steps there are, and the command to run next)."""

    NO_CHECKPOINT = "no committed checkpoint"  # nothing committed at all
    NO_SUCH_STEP = "no such step"  # ``Rollback.to`` has no step directory
    NOT_COMMITTED = "not committed"  # ``Rollback.to`` has a directory but no manifest
    NONE_VALID = "no valid checkpoint to roll back to"  # every candidate failed its check


@dataclass(frozen=True)
class RecoveryPlan:
    """One decision. ``check`` set: judge that step and plan again (the plan is not final).
    Otherwise ``step`` is where the run resumes or the rollback lands (None: a fresh start, or,
    with ``tried`` or ``problem``, nothing usable), and ``actions`` are carried out in order."""

    step: int | None
    actions: tuple[Action, ...] = ()
    check: int | None = None
    tried: tuple[int, ...] = ()  # steps judged and failed, in the order they were checked
    problem: str | None = None  # why there is no step, when that is an error
    refused: Refusal | None = None  # a rollback's ``problem``, as a kind the executor words

    @property
    def quarantined(self) -> tuple[int, ...]:
        """The steps this plan moves into quarantine, in the order of its actions."""
        return tuple(a.step for a in self.actions if isinstance(a, Quarantine))

    @property
    def lines(self) -> list[str]:
        """A line per action, as ``ckpt recover`` and the resume's log show them."""
        return [a.says for a in self.actions if a.says]


def plan(view: StoreView, intent: Intent, checks: Mapping[int, Checked] | None = None) -> RecoveryPlan:
    """The recovery decision for ``intent`` on ``view``, given the steps already judged."""
    checks = checks or {}
    if isinstance(intent, Settle):
        return _settle(view, intent, checks)
    if isinstance(intent, Rollback):
        return _rollback(view, intent, checks)
    if isinstance(intent, Resume):
        return _resume(view)
    if isinstance(intent, Start):
        return _start(view, checks)
    return _damaged(view, intent)


def _start(view: StoreView, checks: Mapping[int, Checked]) -> RecoveryPlan:
    latest = view.latest if view.latest_problem is None and view.latest in view.committed else None
    if latest is not None:
        if latest not in checks:
            return RecoveryPlan(None, check=latest)
        if checks[latest].ok:
            return RecoveryPlan(latest)
    reason = f"ckpt recover: step {latest} is damaged" if latest is not None else "ckpt recover: LATEST is missing or damaged"
    # the rollback quarantines LATEST with its own reason, as `ckpt rollback` would
    return _rollback(view, Rollback(reason=reason), {s: c for s, c in checks.items() if s != latest})


def _settle(view: StoreView, intent: Settle, checks: Mapping[int, Checked]) -> RecoveryPlan:
    actions: list[Action] = [Remove(name, kind) for name, kind in view.leftovers]
    latest = view.latest
    if latest is None and view.committed and intent.can_check:
        cause = view.latest_problem or "LATEST was missing"
        for step in reversed(view.committed):
            if step not in checks:
                return RecoveryPlan(None, tuple(actions), check=step)
            if checks[step].ok:
                says = f"{cause}: LATEST now names {layout.step_dir_name(step)}, the newest valid checkpoint"
                actions.append(MoveLatest(step, cause, "repair_latest", says=says))
                latest = step
                break
            says = f"quarantined {layout.step_dir_name(step)} (not valid; {cause})"
            actions.append(Quarantine(step, f"not valid ({cause})", says))
    elif latest is not None:
        for step in (s for s in view.committed if s > view.latest):  # type: ignore[operator]
            if intent.can_check and step not in checks:
                return RecoveryPlan(latest, tuple(actions), check=step)
            if intent.can_check and checks[step].ok:
                says = f"LATEST moved forward to {layout.step_dir_name(step)} (committed, pointer not yet moved at the crash)"
                actions.append(MoveLatest(step, "", "roll_forward", previous=latest, says=says))
                latest = step
            else:
                says = f"quarantined {layout.step_dir_name(step)} (newer than LATEST, not valid)"
                actions.append(Quarantine(step, "newer than LATEST and not valid", says))
    return RecoveryPlan(latest, tuple(actions), tried=tuple(s for s, c in checks.items() if not c.ok))


def _refuse(why: Refusal, tried: Iterable[int] = ()) -> RecoveryPlan:
    return RecoveryPlan(None, tried=tuple(tried), problem=why.value, refused=why)


def _rollback(view: StoreView, intent: Rollback, checks: Mapping[int, Checked]) -> RecoveryPlan:
    latest = view.latest
    if not view.committed:
        return _refuse(Refusal.NO_CHECKPOINT)
    if intent.to is not None and intent.to not in view.committed:
        return _refuse(Refusal.NOT_COMMITTED if intent.to in view.step_dirs else Refusal.NO_SUCH_STEP)
    if intent.to is not None:
        candidates = [intent.to]
    elif intent.auto:
        candidates = [s for s in reversed(view.committed) if latest is None or s <= latest]
    else:
        candidates = [s for s in reversed(view.committed) if latest is None or s < latest]
    tried: list[int] = []
    target = None
    for step in candidates:
        if step not in checks:
            return RecoveryPlan(None, check=step, tried=tuple(tried))
        if checks[step].ok:
            target = step
            break
        tried.append(step)
    if target is None:
        return _refuse(Refusal.NONE_VALID, tried)
    problems = {s: "; ".join(c.problems[:3]) for s, c in checks.items()}
    # every step directory after the target, committed or not (a manifest may be what is damaged)
    actions: list[Action] = [
        Quarantine(s, f"{intent.reason}: {problems.get(s) or f'rolled back to {target}'}")
        for s in steps_to_quarantine_on_rollback(view.step_dirs, latest, target)
    ]
    if target != latest:
        reason = intent.reason if view.latest_problem is None else f"{intent.reason} ({view.latest_problem})"
        actions.append(MoveLatest(target, reason))
    return RecoveryPlan(target, tuple(actions), tried=tuple(tried))


def _resume(view: StoreView) -> RecoveryPlan:
    if view.latest_problem is None:
        return RecoveryPlan(view.latest)  # LATEST names a committed step (None: nothing at all yet)
    step = fallback_step(view.committed, None)
    if step is None:
        return RecoveryPlan(None, problem=f"{view.latest_problem}, and no committed checkpoint is left")
    return RecoveryPlan(step, (MoveLatest(step, view.latest_problem, says=f"{view.latest_problem} (LATEST moved to step {step})"),))


def _damaged(view: StoreView, intent: Damaged) -> RecoveryPlan:
    reason = "; ".join(intent.problems[:5])
    actions: list[Action] = [Quarantine(intent.step, reason, f"step {intent.step} (damaged and quarantined, see above)")]
    previous = fallback_step(view.committed, intent.step)
    if previous is not None:
        actions.append(MoveLatest(previous, f"step {intent.step} damaged: {reason}"))
    return RecoveryPlan(previous, tuple(actions), tried=(intent.step,))


# ------------------------------------------------------------------ `ckpt recover`'s decision, kept for the ranks
RECOVER_NAME = "recover.json"  # RUN_DIR/recover.json: what `ckpt recover` decided at this start


@dataclass(frozen=True)
class Recorded:
    """``ckpt recover``'s decision as ``RUN_DIR/recover.json`` keeps it, with what makes it
    current: the store it was taken on (``store``, a resolved path), a fingerprint of the facts
    it judged (``facts``: the step directories, leftovers, LATEST and its manifest, taken right
    after it; any commit, rollback, quarantine or clean-up since changes it) and the world size it
    was planned for. ``reshard`` is its reshard plan's JSON."""

    step: int | None
    world_size: int | None
    store: str | None
    facts: str | None
    reshard: Mapping[str, object] | None = None
    hashes_checked: bool = False

    @classmethod
    def from_json(cls, data: object) -> Recorded | None:
        """The decision in ``data`` (recover.json's JSON), or None when it is not one (an older
        file without the identity fields, a torn or hand-edited one)."""
        if not isinstance(data, Mapping) or data.get("action") != "resume":
            return None
        step, world, store, facts = (data.get(k) for k in ("step", "world_size", "store", "facts"))
        if not isinstance(step, int) or not isinstance(store, str) or not isinstance(facts, str):
            return None
        reshard = data.get("reshard")
        return cls(
            step,
            world if isinstance(world, int) else None,
            store,
            facts,
            reshard if isinstance(reshard, Mapping) else None,
            data.get("hashes_checked") is True,
        )


def stale_because(recorded: Recorded, store: str, latest: int | None, facts: str | None, world_size: int) -> str | None:
    """Why the ranks may not take ``recorded`` as their decision (None: they take it): it was
    taken on another directory, LATEST names another step now, the store's index changed since
    (a commit, rollback, quarantine or clean-up: the facts it judged are gone), or it was
    planned for another world size. A stale decision is not followed: the ranks plan themselves."""
    if recorded.store != store:
        return f"it was taken on {recorded.store}, not {store}"
    if latest != recorded.step:
        return f"it chose step {recorded.step} and LATEST now names {'nothing' if latest is None else f'step {latest}'}"
    if facts != recorded.facts:
        return "the checkpoint directory changed since (a save, rollback, quarantine, clean-up or rewritten manifest)"
    if recorded.world_size is not None and recorded.world_size != world_size:
        return f"it was planned for {recorded.world_size} ranks, this run has {world_size}"
    return None


__all__ = [
    "Action",
    "Checked",
    "Damaged",
    "Intent",
    "MoveLatest",
    "Quarantine",
    "RECOVER_NAME",
    "RecoveryPlan",
    "Recorded",
    "Refusal",
    "Remove",
    "Resume",
    "Rollback",
    "Settle",
    "Start",
    "StoreView",
    "fallback_step",
    "plan",
    "stale_because",
    "steps_to_quarantine_on_rollback",
]
