"""Moving LATEST back to a good checkpoint, quarantining the bad ones (never deleting).

The recovery planner (``core.recovery``, ``Rollback``) decides which step, what is quarantined
and when there is nowhere to go; this module checks the steps it asks about (validate, and with
``auto`` verify), words its refusals and has the executor (``store.recovery``) carry the plan out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckpt_tool.core.recovery import Checked, RecoveryPlan, Refusal, Rollback, Start
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store import recovery
from ckpt_tool.store.inventory import listing as take_listing
from ckpt_tool.store.store import CheckpointStore


@dataclass(frozen=True)
class Attempt:
    """One step the rollback judged: ``valid`` (its structure check) and ``verified`` (the probe re-measured;
    None when not run), with the problems found."""

    step: int
    valid: bool
    verified: bool | None  # None: not run (no probe, or not asked)
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Usable as a target: valid, and not failed by a verify."""
        return self.valid and self.verified is not False


@dataclass(frozen=True)
class RollbackReport:
    """What a rollback did (or with ``dry_run`` would do): LATEST before and why it could not be trusted, the
    target step, the steps quarantined and each step judged on the way."""

    previous_latest: int | None
    target: int
    quarantined: tuple[int, ...]  # moved, or with ``dry_run`` those that would be
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)
    dry_run: bool = False
    latest_problem: str | None = None  # why LATEST could not be trusted (garbage, missing step)
    notes: tuple[str, ...] = ()  # check results that could not be recorded, and the like

    def to_json(self) -> dict[str, Any]:
        """``--json``'s form; with ``dry_run`` the steps go under ``would_quarantine`` and ``quarantined`` is empty."""
        return {
            "previous_latest": self.previous_latest,
            "latest_problem": self.latest_problem,
            "target": self.target,
            "dry_run": self.dry_run,
            "quarantined": [] if self.dry_run else list(self.quarantined),
            "would_quarantine": list(self.quarantined) if self.dry_run else [],
            "attempts": [
                {"step": a.step, "valid": a.valid, "verified": a.verified, "ok": a.ok, "problems": list(a.problems)} for a in self.attempts
            ],
            "notes": list(self.notes),
        }


def check_step(
    store: CheckpointStore, step: int, verify: bool, entry: str | None = None, record: bool = True, notes: list[str] | None = None
) -> Attempt:
    """Validate (and, when asked, verify) one step. Files this user may not read are not
    damage: that raises (exit 2) rather than judging the step. ``record=False`` (a dry run)
    writes nothing; otherwise a verification result goes to the index, best effort (a note in
    ``notes`` when the directory is read-only)."""
    from ckpt_tool.training.validation import validate_checkpoint  # torch, for the DCP metadata: only when a step is judged

    result = validate_checkpoint(store, step)
    if result.unreadable and not result.problems:
        raise store.permission_denied(store.step_path(step) / result.unreadable[0])
    if not result.ok:
        return Attempt(step, False, None, tuple(str(p) for p in result.problems))
    if not verify or result.manifest is None or result.manifest.probe is None or not (entry or result.manifest.entry_point):
        return Attempt(step, True, None)
    from ckpt_tool.ops.verify import verify_checkpoint

    report = verify_checkpoint(store, step, entry)
    failed = [f"verify {c.name}: recorded {c.recorded!r}, measured {c.measured!r} ({c.how})" for c in report.checks if not c.ok]
    if record:
        note = store.record_check(step, "verified", report.ok, failed)
        if note and notes is not None:
            notes.append(note)
    return Attempt(step, True, report.ok, tuple(failed))


def rollback(
    store: CheckpointStore,
    to: int | None = None,
    auto: bool = False,
    dry_run: bool = False,
    entry: str | None = None,
    reason: str = "manual rollback",
    start_check: Callable[[int], bool] | None = None,
) -> RollbackReport:
    """Without ``auto``: to ``to``, or to the newest valid checkpoint older than LATEST.
    With ``auto``: walk back from LATEST, validating then verifying each, until one passes.
    With ``start_check`` (``ckpt recover``): LATEST stays when it passes that check, else as
    without ``auto`` (the planner's ``Start``). ``dry_run`` changes nothing on disk (not even the index)."""
    if start_check is None:
        listing = take_listing(store)  # its words for what is wrong with LATEST
        latest, latest_problem = listing.latest, listing.latest_problem
    else:  # at every start: no index read
        latest, latest_problem = store.read_latest_or_problem()
    facts = recovery.view(store, latest, latest_problem)
    notes: list[str] = []
    attempts: dict[int, Attempt] = {}

    def judge(step: int) -> Checked:
        if start_check is not None and step == latest:
            return Checked(step, start_check(step))  # the start's own check of LATEST, not one of the rollback's attempts
        attempts[step] = attempt = check_step(store, step, verify=auto, entry=entry, record=not dry_run, notes=notes)
        return Checked(step, attempt.ok, attempt.problems)

    decided, _ = recovery.decide(facts, Rollback(to, auto, reason) if start_check is None else Start(), judge)
    if decided.refused is not None:
        raise _refusal(store, decided, to, facts.committed, list(attempts))
    assert decided.step is not None  # a rollback's plan has a step or a refusal
    if not dry_run:
        recovery.carry_out(store, decided)
    return RollbackReport(latest, decided.step, decided.quarantined, tuple(attempts.values()), dry_run, latest_problem, tuple(notes))


def _refusal(store: CheckpointStore, decided: RecoveryPlan, to: int | None, committed: tuple[int, ...], tried: list[int]) -> CkptError:
    """The planner's refusal in the user's words: what is missing and what to run next (exit 3)."""
    if decided.refused is Refusal.NO_CHECKPOINT:
        return CkptError(f"{store.root} holds no committed checkpoint", "nothing to roll back to; check the path", ExitCode.NOT_FOUND)
    if decided.refused is Refusal.NO_SUCH_STEP:
        assert to is not None
        return store.no_such_step(to)
    if decided.refused is Refusal.NOT_COMMITTED:
        return CkptError(
            f"step {to} in {store.root} has no manifest: it is not a committed checkpoint",
            f"committed steps: {', '.join(map(str, committed[-10:]))} (see `ckpt list`)",
            ExitCode.NOT_FOUND,
        )
    return CkptError(
        f"no valid checkpoint to roll back to in {store.root} (tried: {', '.join(map(str, tried)) or 'none'})",
        "run `ckpt validate --all` to see the damage; older copies may be in quarantine/",
        ExitCode.NOT_FOUND,
    )
