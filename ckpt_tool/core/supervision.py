"""What the watchdog decides from heartbeats. Pure: times and beats in, decisions out.

- ``Beat`` is the last beat of a rank; ``find_hangs`` says when the job is hung: no beat from
  any rank for longer than the phase timeout of the rank the others wait for (the one behind).
- ``CrashLoopBreaker`` stops restarting when ``limit`` restarts in a row made no progress past
  the same checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Beat:
    """The last heartbeat of one rank: its pid, step and phase, when the supervisor received it, and what it
    knows of checkpoints."""

    rank: int
    pid: int
    step: int
    phase: str
    time: float  # when the supervisor received it (its own monotonic clock)
    attempt: int = 0  # torchrun's restart count
    ckpt: int | None = None  # newest checkpoint the rank knows committed
    resumed_from: int | None = None  # the checkpoint this attempt resumed from (None: fresh start)


def beat_of(m: Mapping[str, Any], now: float, attempt: int) -> Beat | None:
    """The beat in a rank's message (``training.heartbeat``), or None when it is not one."""
    try:
        resumed_from = m.get("resumed_from")
        ckpt = m.get("ckpt")
        return Beat(
            int(m["rank"]),
            int(m["pid"]),
            int(m["step"]),
            str(m["phase"]),
            now,
            attempt,
            None if ckpt is None else int(ckpt),
            None if resumed_from is None else int(resumed_from),
        )
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Hang:
    """A rank found hung: its pid, phase and step, how long it has been silent and the timeout it passed (seconds)."""

    rank: int
    pid: int
    phase: str
    step: int
    silent_s: float
    timeout_s: float

    def reason(self) -> str:
        """One line for the events log and the user: which rank, silent how long in which phase and step,
        against which timeout."""
        return f"rank {self.rank} silent for {self.silent_s:.1f} s in phase {self.phase!r} at step {self.step} (timeout {self.timeout_s:.1f} s)"


def find_hangs(last_beats: Iterable[Beat], timeouts: Mapping[str, float], now: float) -> list[Hang]:
    """Is the job hung? No rank has beaten for longer than the allowance of the rank the
    others wait for.

    Ranks of one job wait for each other in collectives, so one stuck rank soon silences all.
    The rank the others wait for (the culprit) is the one behind: the lowest step; among ranks
    at the same step, the one in the phase with the longest timeout (the others finished that
    phase and wait for it), then the oldest beat. The job is hung when no rank at all has beaten
    for longer than the culprit's phase timeout. So a rank in a 20 s data stall is not a hang
    though its peers wait silently in ``step``, whichever beat came first; a rank frozen in
    ``step`` is caught in seconds even when its peers went on into the next ``checkpoint`` and
    wait there. Returns every rank, culprit first, or an empty list.
    """

    def allowance(b: Beat) -> float:
        return timeouts.get(b.phase, timeouts.get("step", 60.0))

    beats = sorted(last_beats, key=lambda b: (b.step, -allowance(b), b.time, b.rank))
    if not beats:
        return []
    culprit, last_progress = beats[0], max(b.time for b in beats)
    timeout = allowance(culprit)
    if now - last_progress <= timeout:
        return []
    return [Hang(b.rank, b.pid, b.phase, b.step, now - b.time, timeout) for b in beats]


@dataclass
class CrashLoopBreaker:
    """Counts restarts that made no progress: the newest checkpoint did not move."""

    limit: int
    stalled: int = 0
    last_ckpt: int | None = None
    started: bool = False

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"crash-loop limit must be >= 1, got {self.limit}")

    def on_failure(self, newest_ckpt: int | None) -> bool:
        """Record a failure; True when ``limit`` failures came in a row with the same newest
        checkpoint (no new commit in between): restarting again would only repeat them."""
        same = self.started and newest_ckpt == self.last_ckpt
        self.stalled = self.stalled + 1 if same else 1
        self.started = True
        self.last_ckpt = newest_ckpt
        return self.stalled >= self.limit

    def message(self, on_disk: int | None = None) -> str:
        """``on_disk``: the newest checkpoint in the directory, when the supervisor knows it (the
        ranks may have failed before they could say which one they resumed from)."""
        newest = self.last_ckpt if self.last_ckpt is not None else on_disk
        if newest is not None:
            where = f"past checkpoint step {newest}"
        else:
            where = "before any checkpoint was loaded or saved"
        return f"crash loop: {self.stalled} failures in a row without a new checkpoint ({where}); not restarting again"
