"""Retention: which committed checkpoints may be deleted after a new one is committed.

Pure. Rules (the store applies them only after a newer checkpoint is committed):
- keep the newest ``keep_last`` committed steps;
- keep every step divisible by ``keep_every`` (long-term snapshots), when set;
- never delete the step LATEST names (the newest valid checkpoint), even if it is older than
  others (after a rollback the newer ones are quarantined, not deleted);
- quarantined checkpoints are not in the candidate list at all: they live in ``quarantine/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = 3
    keep_every: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.keep_last, int) or self.keep_last < 1:
            raise ValueError(
                f"keep_last must be >= 1, got {self.keep_last!r}: the newest committed checkpoint is what a restart resumes from"
            )
        if self.keep_every is not None and (not isinstance(self.keep_every, int) or self.keep_every < 1):
            raise ValueError(f"keep_every must be a positive integer or None, got {self.keep_every!r}")


def steps_to_delete(committed: Iterable[int], latest: int | None, policy: RetentionPolicy) -> list[int]:
    """Steps to delete, oldest first. ``committed`` are the committed step directories on disk."""
    steps = sorted(set(committed))
    keep = set(steps[-policy.keep_last :])
    if policy.keep_every is not None:
        keep.update(s for s in steps if s % policy.keep_every == 0)
    if latest is not None:
        keep.add(latest)
        # Nothing newer than LATEST is ours to judge here (a rollback or roll-forward decides).
        keep.update(s for s in steps if s > latest)
    return [s for s in steps if s not in keep]
