"""Retention: which committed checkpoints may be deleted after a new one is committed.

Pure. Rules (the store applies them only after a newer checkpoint is committed):
- keep the newest ``keep_last`` committed steps **that are valid as far as anyone knows**: a step
  whose last check failed (``invalid`` in the index) neither counts towards ``keep_last`` nor is
  deleted here (it is evidence; ``ckpt rollback`` moves it to quarantine);
- keep every step divisible by ``keep_every`` (long-term snapshots), when set;
- never delete the step LATEST names, even if it is older than others (after a rollback the
  newer ones are quarantined, not deleted), nor anything newer than LATEST;
- quarantined checkpoints are not in the candidate list at all: they live in ``quarantine/``.
The store adds the last rule that needs the disk: a delete happens only while a kept checkpoint
is known to pass validation (the one just committed, or one validated right before deleting).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
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
