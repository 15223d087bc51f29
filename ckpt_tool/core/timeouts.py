"""Phase-aware hang timeouts, calibrated from observed durations. Pure.

A rank reports the phase it is in (``init``, ``step``, ``data``, ``checkpoint``, ``eval``) with each
heartbeat. A hang is no heartbeat for longer than the current phase's timeout. Each phase's
timeout is ``max(floor, factor x the longest duration observed after warm-up)``, unless the
user overrides it. Before a phase is observed its floor is generous (a checkpoint may take
10 minutes); once observed, the floor drops (a checkpoint: 60 s) and the observations rule. The
data floor stays at 60 s: a data stall is not a hang however fast batches usually come, while
a frozen training step is caught in seconds. Calibrated values are persisted in the run directory so a restart starts calibrated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PHASES = ("init", "step", "data", "checkpoint", "eval")

DEFAULT_FLOORS: Mapping[str, float] = {  # before a phase has been observed
    "init": 600.0,  # process start, rendezvous, model build, resume + load
    "step": 5.0,  # forward/backward/optimizer between two beats
    "data": 60.0,  # a dataloader may stall on a shared filesystem
    "checkpoint": 600.0,  # a sync save of a large state
    "eval": 600.0,
}
CALIBRATED_FLOORS: Mapping[str, float] = {  # once observed: never below these
    "init": 600.0,  # not calibrated: it happens once per start
    "step": 5.0,
    "data": 60.0,  # a stall is not a hang: the allowance does not shrink with fast batches
    "checkpoint": 60.0,
    "eval": 60.0,
}


@dataclass(frozen=True)
class TimeoutPolicy:
    """How ``calibrate`` sets the timeouts: ``factor`` x the longest duration observed after ``warmup``
    observations, floors and overrides in seconds per phase. Raises ``ValueError`` at construction for a factor
    below 1, an unknown phase or a non-positive value."""

    factor: float = 4.0
    warmup: int = 3  # first observations of each phase are ignored (allocation, compilation)
    floors: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FLOORS))
    overrides: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1 (a timeout shorter than what was observed fires on healthy runs), got {self.factor}")
        for phase, value in {**self.floors, **self.overrides}.items():
            if phase not in PHASES:
                raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
            if not value > 0:
                raise ValueError(f"timeout of phase {phase!r} must be positive, got {value}")


def calibrate(observed: Mapping[str, Iterable[float]], policy: TimeoutPolicy) -> dict[str, float]:
    """Timeout per phase from the durations observed so far (oldest first)."""
    out = {}
    for phase in PHASES:
        if phase in policy.overrides:
            out[phase] = float(policy.overrides[phase])
            continue
        samples = list(observed.get(phase, ()))[policy.warmup :]
        if samples and phase != "init":
            out[phase] = max(float(CALIBRATED_FLOORS[phase]), policy.factor * max(samples))
        else:
            out[phase] = float(policy.floors.get(phase, DEFAULT_FLOORS[phase]))
    return out


@dataclass
class DurationLog:
    """Observed phase durations, bounded (the most recent ``keep`` per phase); JSON round-trip."""

    keep: int = 200
    durations: dict[str, list[float]] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        """Record one duration of ``phase`` in seconds, dropping the oldest beyond ``keep``."""
        samples = self.durations.setdefault(phase, [])
        samples.append(seconds)
        del samples[: max(0, len(samples) - self.keep)]

    def to_json(self) -> dict[str, list[float]]:
        """``{phase: [seconds, ...]}``, oldest first (a copy)."""
        return {k: list(v) for k, v in self.durations.items()}

    @staticmethod
    def from_json(data: object, keep: int = 200) -> DurationLog:
        """The log written by ``to_json``; what is not a phase or not a non-negative number is skipped (a torn or
        foreign file gives an empty log, never an error)."""
        log = DurationLog(keep)
        if isinstance(data, dict):
            for phase, samples in data.items():
                if phase in PHASES and isinstance(samples, list):
                    for s in samples:
                        if isinstance(s, (int, float)) and s >= 0:
                            log.add(phase, float(s))
        return log
