"""Who may write a checkpoint directory: one job at a time. Pure decision.

The writing job records itself in ``DIR/.owner.json`` (job id, host, pid, since, last seen) and
refreshes ``last_seen`` while it runs. Another job is refused while the owner is alive; it takes
over when told to, when the owner is the same SLURM job (a requeue or a restart), when the
owner's process is gone on this host, or when the owner has not been seen for ``stale_after_s``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Owner:
    """The job that writes a checkpoint directory, as ``DIR/.owner.json`` records it. ``job_id``: the SLURM
    job id (None outside SLURM); ``since`` and ``last_seen``: wall-clock seconds (epoch) of the claim and
    of its last refresh."""

    job_id: str | None
    host: str
    pid: int
    since: float
    last_seen: float

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (what ``.owner.json`` holds)."""
        return asdict(self)

    @staticmethod
    def from_json(data: Any) -> Owner | None:
        """The owner a parsed ``.owner.json`` names; None when it is damaged (a missing field, a wrong
        type): treated as no owner."""
        try:
            return Owner(
                None if data.get("job_id") is None else str(data["job_id"]),
                str(data["host"]),
                int(data["pid"]),
                float(data["since"]),
                float(data["last_seen"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None  # damaged: treated as no owner

    def describe(self, now: float) -> str:
        """One line for a refusal: which job, host and pid, and how long ago (seconds before ``now``) it
        claimed the directory and was last seen."""
        job = f"job {self.job_id}" if self.job_id else "a job outside SLURM"
        return f"{job} on {self.host} (pid {self.pid}), owner since {now - self.since:.0f} s, last seen {now - self.last_seen:.0f} s ago"


def same_claim(a: Owner, b: Owner) -> bool:
    """The same claim: host, pid and the time of the claim (a pid reused later claims anew)."""
    return (a.host, a.pid, a.since) == (b.host, b.pid, b.since)


@dataclass(frozen=True)
class OwnershipDecision:
    """Whether a job may write the directory, and why (a few words, shown to the user and logged)."""

    allowed: bool
    reason: str


def decide(
    current: Owner | None, me: Owner, now: float, stale_after_s: float, pid_alive: bool | None, take_over: bool
) -> OwnershipDecision:
    """``pid_alive``: whether the owner's pid is alive, when the owner is on this host (else None)."""
    if current is None:
        return OwnershipDecision(True, "no owner")
    if current.job_id is not None and current.job_id == me.job_id:
        return OwnershipDecision(True, "same SLURM job (requeue or restart)")
    if current.host == me.host and current.pid == me.pid:
        return OwnershipDecision(True, "same process")
    if current.host == me.host and pid_alive is False:
        return OwnershipDecision(True, f"stale: the owner's process {current.pid} is gone")
    if now - current.last_seen > stale_after_s:
        return OwnershipDecision(True, f"stale: not seen for {now - current.last_seen:.0f} s (> {stale_after_s:.0f} s)")
    if take_over:
        return OwnershipDecision(True, "take-over requested")
    return OwnershipDecision(False, current.describe(now))
