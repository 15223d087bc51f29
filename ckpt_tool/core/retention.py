"""Retention: which committed checkpoints may be deleted after a new one is committed.

Pure. Rules (the store applies them only after a newer checkpoint is committed):
- keep the newest ``keep_last`` committed steps **that are valid as far as anyone knows**: a step
  whose last check failed (``invalid`` in the index) neither counts towards ``keep_last`` nor is
  deleted here (it is evidence; ``ckpt rollback`` moves it to quarantine);
- keep every step divisible by ``keep_every`` (long-term snapshots), when set;
- never delete the step LATEST names, even if it is older than others (after a rollback the
  newer ones are quarantined, not deleted), nor anything newer than LATEST;
- quarantined checkpoints are not in the candidate list at all: they live in ``quarantine/``.
- a delete happens only while a kept checkpoint is known to pass validation (the one just
  committed, or one validated right before deleting): ``plan_prune`` says which step to validate
  and, once one passes, what to delete; ``store.prune`` validates and deletes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RetentionPolicy:
    """How many committed checkpoints to keep: the newest ``keep_last`` valid ones (at least 1), and every
    step divisible by ``keep_every`` when given. Raises ``ValueError`` for values out of range."""

    keep_last: int = 3
    keep_every: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.keep_last, int) or self.keep_last < 1:
            raise ValueError(
                f"keep_last must be >= 1, got {self.keep_last!r}: the newest committed checkpoint is what a restart resumes from"
            )
        if self.keep_every is not None and (not isinstance(self.keep_every, int) or self.keep_every < 1):
            raise ValueError(f"keep_every must be a positive integer or None, got {self.keep_every!r}")

    def describe(self) -> str:
        """The policy in words for the user: ``keep the last 3 and every step divisible by 1000``."""
        every = f" and every step divisible by {self.keep_every}" if self.keep_every else ""
        return f"keep the last {self.keep_last}{every}"


def steps_to_delete(committed: Iterable[int], latest: int | None, policy: RetentionPolicy, invalid: Collection[int] = ()) -> list[int]:
    """Steps to delete, oldest first. ``committed`` are the committed step directories on disk,
    ``invalid`` the steps whose last recorded check failed."""
    steps = sorted(set(committed))
    trusted = [s for s in steps if s not in invalid]
    keep = set(trusted[-policy.keep_last :]) | {s for s in steps if s in invalid}
    if policy.keep_every is not None:
        keep.update(s for s in steps if s % policy.keep_every == 0)
    if latest is not None:
        keep.add(latest)
        # Nothing newer than LATEST is ours to judge here (a rollback or roll-forward decides).
        keep.update(s for s in steps if s > latest)
    return [s for s in steps if s not in keep]


def kept_candidates(committed: Iterable[int], victims: Collection[int], invalid: Collection[int]) -> list[int]:
    """The kept steps that may vouch for the directory (not known invalid), newest first: one
    of them must pass validation before anything is deleted."""
    return sorted((s for s in set(committed) if s not in victims and s not in invalid), reverse=True)


@dataclass(frozen=True)
class PrunePlan:
    """Retention's decision. ``victims``: steps to delete, oldest first. ``vouched``: the kept step
    known to pass validation that allows the deletes. ``check`` set: validate that step and plan
    again (the plan is not final); neither set while there are victims: nothing vouches for the
    directory and nothing may be deleted."""

    victims: tuple[int, ...]
    vouched: int | None = None
    check: int | None = None

    @property
    def allowed(self) -> bool:
        """Deletes may happen: there are victims and a kept step vouches for the directory."""
        return bool(self.victims) and self.vouched is not None


def plan_prune(
    committed: Iterable[int],
    latest: int | None,
    policy: RetentionPolicy,
    invalid: Collection[int] = (),
    known_good: int | None = None,
    checks: Mapping[int, bool] | None = None,
) -> PrunePlan:
    """Which steps to delete and which kept step vouches for it, given the steps validated so far.

    ``known_good``: a step known to pass without a check (the one just committed, hashed as it
    was written). ``checks``: step -> passed, from validations made for this prune. A kept step
    that fails no longer counts (it is treated as ``invalid``), so the plan changes: older valid
    steps are kept in its place and the newest kept one not yet judged is asked for (``check``).
    No LATEST: nothing is deleted (a damaged pointer is repaired first). ``invalid`` only ever
    adds keeps: a plan without victims stays so whatever the index says (callers may skip
    reading it)."""
    checks = checks or {}
    if latest is None:
        return PrunePlan(())
    bad = set(invalid) | {s for s, ok in checks.items() if not ok}
    victims = steps_to_delete(committed, latest, policy, bad)
    if not victims:
        return PrunePlan(())
    candidates = kept_candidates(committed, victims, bad)
    if known_good in candidates:
        return PrunePlan(tuple(victims), vouched=known_good)
    if not candidates:
        return PrunePlan(tuple(victims))
    newest = candidates[0]  # the failed ones are no longer candidates: judged here means passed
    if newest in checks:
        return PrunePlan(tuple(victims), vouched=newest)
    return PrunePlan(tuple(victims), check=newest)
