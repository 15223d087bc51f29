"""Moving LATEST back to a good checkpoint, quarantining the bad ones (never deleting)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_tool.core.recovery import steps_to_quarantine_on_rollback
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore


@dataclass(frozen=True)
class Attempt:
    step: int
    valid: bool
    verified: bool | None  # None: not run (no probe, or not asked)
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.valid and self.verified is not False


@dataclass(frozen=True)
class RollbackReport:
    previous_latest: int | None
    target: int
    quarantined: tuple[int, ...]  # moved, or with ``dry_run`` those that would be
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)
    dry_run: bool = False
    latest_problem: str | None = None  # why LATEST could not be trusted (garbage, missing step)
    notes: tuple[str, ...] = ()  # check results that could not be recorded, and the like

    def to_json(self) -> dict[str, Any]:
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
) -> RollbackReport:
    """Without ``auto``: to ``to``, or to the newest valid checkpoint older than LATEST.
    With ``auto``: walk back from LATEST, validating then verifying each, until one passes.
    ``dry_run`` changes nothing on disk (not even the index)."""
    listing = store.listing()
    latest = listing.latest
    committed = store.committed_on_disk()
    if not committed:
        raise CkptError(f"{store.root} holds no committed checkpoint", "nothing to roll back to; check the path", ExitCode.NOT_FOUND)
    if to is not None:
        if not store.step_path(to).is_dir():
            raise store.no_such_step(to)
        if to not in committed:
            raise CkptError(
                f"step {to} in {store.root} has no manifest: it is not a committed checkpoint",
                f"committed steps: {', '.join(map(str, committed[-10:]))} (see `ckpt list`)",
                ExitCode.NOT_FOUND,
            )
        candidates = [to]
    elif auto:
        candidates = [s for s in reversed(committed) if latest is None or s <= latest]
    else:
        candidates = [s for s in reversed(committed) if latest is None or s < latest]
    attempts = []
    notes: list[str] = []
    for step in candidates:
        attempt = check_step(store, step, verify=auto, entry=entry, record=not dry_run, notes=notes)
        attempts.append(attempt)
        if attempt.ok:
            target = step
            break
    else:
        tried = ", ".join(str(a.step) for a in attempts) or "none"
        raise CkptError(
            f"no valid checkpoint to roll back to in {store.root} (tried: {tried})",
            "run `ckpt validate --all` to see the damage; older copies may be in quarantine/",
            ExitCode.NOT_FOUND,
        )
    # every step directory after the target, committed or not (a manifest may be what is damaged)
    quarantine = steps_to_quarantine_on_rollback(store.step_dirs(), latest, target)
    if not dry_run:
        problems = {a.step: "; ".join(a.problems[:3]) for a in attempts}
        for step in quarantine:
            store.quarantine(step, f"{reason}: {problems.get(step) or f'rolled back to {target}'}")
        if target != latest:
            store.set_latest(target, reason if listing.latest_problem is None else f"{reason} ({listing.latest_problem})")
    return RollbackReport(latest, target, tuple(quarantine), tuple(attempts), dry_run, listing.latest_problem, tuple(notes))
