"""Recovery decisions: which checkpoint to resume from, and where to fall back. Pure."""

from __future__ import annotations

from collections.abc import Iterable


def fallback_step(committed: Iterable[int], below: int | None) -> int | None:
    """The newest committed step strictly older than ``below`` (the newest of all when None)."""
    candidates = [s for s in committed if below is None or s < below]
    return max(candidates) if candidates else None


def steps_to_quarantine_on_rollback(committed: Iterable[int], latest: int | None, target: int) -> list[int]:
    """Rolling back to ``target`` quarantines every committed step after it up to LATEST
    (all of them when LATEST is unknown): they are what the user judged bad."""
    return sorted(s for s in committed if s > target and (latest is None or s <= latest))
