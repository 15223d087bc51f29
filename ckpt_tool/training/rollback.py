"""Moving LATEST back to a good checkpoint, quarantining the bad ones (never deleting)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_tool.core.recovery import steps_to_quarantine_on_rollback
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.validate import validate_step


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
    quarantined: tuple[int, ...]
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "previous_latest": self.previous_latest,
            "target": self.target,
            "quarantined": list(self.quarantined),
            "dry_run": self.dry_run,
            "attempts": [{"step": a.step, "valid": a.valid, "verified": a.verified, "ok": a.ok, "problems": list(a.problems)} for a in self.attempts],
        }


def check_step(store: CheckpointStore, step: int, verify: bool, entry: str | None = None) -> Attempt:
    result = validate_step(store, step)
    if not result.ok:
        return Attempt(step, False, None, tuple(str(p) for p in result.problems))
    if not verify or result.manifest is None or result.manifest.probe is None or not (entry or result.manifest.entry_point):
        return Attempt(step, True, None)
    from ckpt_tool.training.verify import verify_step  # noqa: PLC0415 - builds a model: only when asked

    report = verify_step(store, step, entry)
    store.record_check(step, "verified", report.ok, [f"{c.name}: recorded {c.recorded!r}, measured {c.measured!r}" for c in report.checks if not c.ok])
    return Attempt(step, True, report.ok, tuple(f"verify {c.name}: recorded {c.recorded!r}, measured {c.measured!r} ({c.how})" for c in report.checks if not c.ok))


def rollback(
    store: CheckpointStore,
    to: int | None = None,
    auto: bool = False,
    dry_run: bool = False,
    entry: str | None = None,
    reason: str = "manual rollback",
) -> RollbackReport:
    """Without ``auto``: to ``to``, or to the newest valid checkpoint older than LATEST.
    With ``auto``: walk back from LATEST, validating then verifying each, until one passes."""
    latest = store.latest_or_none()
    committed = store.committed_on_disk()
    if not committed:
        raise CkptError(f"{store.root} holds no committed checkpoint", "nothing to roll back to; check the path", ExitCode.NOT_FOUND)
    if to is not None:
        if to not in committed:
            raise CkptError(f"step {to} is not a committed checkpoint in {store.root}", f"committed steps: {committed[-10:]} (see `ckpt list`)", ExitCode.NOT_FOUND)
        candidates = [to]
    elif auto:
        candidates = [s for s in reversed(committed) if latest is None or s <= latest]
    else:
        candidates = [s for s in reversed(committed) if latest is None or s < latest]
    attempts = []
    for step in candidates:
        attempt = check_step(store, step, verify=auto, entry=entry)
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
            store.set_latest(target, reason)
    return RollbackReport(latest, target, tuple(quarantine), tuple(attempts), dry_run)
