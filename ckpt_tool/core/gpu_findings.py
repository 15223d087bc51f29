"""What a node's GPU readings mean for its ranks. Pure: samples in, findings out.

- A rank whose GPU sits idle while the other GPUs of its node are busy is a hang candidate: the
  classic hang has the stuck rank's GPU at 0% while its peers spin in a collective at 100%.
  Reported (``gpu_idle``) once per episode, seconds before the phase timeout would fire; the
  timeout still decides the kill (an idle GPU alone can be a rank doing CPU work).
- An uncorrectable ECC error or a critical XID (the driver's error codes) is a hardware fault
  (``gpu_error``): the node is suspect at once (``core.node_ledger``), not after repeated failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of one GPU, taken once a second."""

    index: int  # the device as NVML numbers it
    util: float  # % of the last sample period a kernel ran
    memory_used: int = 0  # bytes
    ecc_uncorrected: int = 0  # volatile count since the driver loaded
    xids: tuple[int, ...] = ()  # critical XID errors since the last sample


@dataclass(frozen=True)
class GpuPolicy:
    """When a GPU counts as idle while its node is busy: its utilisation (%) at or below ``idle_util`` while
    the median of the node's other GPUs is at or above ``busy_util``, for ``idle_samples`` samples in a
    row. Raises ``ValueError`` when ``idle_samples < 1``."""

    idle_util: float = 0.0  # at or below: idle
    busy_util: float = 50.0  # the median of the other GPUs at or above: busy
    idle_samples: int = 3  # samples in a row (one a second) before an idle GPU is reported

    def __post_init__(self) -> None:
        if self.idle_samples < 1:
            raise ValueError("idle_samples must be >= 1")


@dataclass
class GpuWatch:
    """The GPUs of one node's ranks, sample after sample."""

    policy: GpuPolicy = field(default_factory=GpuPolicy)
    idle_for: dict[int, int] = field(default_factory=dict)  # rank -> samples in a row idle while peers busy
    reported_idle: set[int] = field(default_factory=set)
    ecc_seen: dict[int, int] = field(default_factory=dict)  # device -> uncorrected count already reported

    def observe(self, by_rank: Mapping[int, GpuSample]) -> list[tuple[str, dict[str, Any]]]:
        """Take one sample of each rank's GPU and return the findings it brings, as (event, fields):
        ``gpu_idle`` once per idle episode, ``gpu_error`` when a device's uncorrected ECC count grew or
        it reported critical XIDs."""
        found: list[tuple[str, dict[str, Any]]] = []
        for rank, s in sorted(by_rank.items()):
            others = [o.util for r, o in by_rank.items() if r != rank]
            idle = bool(others) and s.util <= self.policy.idle_util and median(others) >= self.policy.busy_util
            self.idle_for[rank] = self.idle_for.get(rank, 0) + 1 if idle else 0
            if self.idle_for[rank] >= self.policy.idle_samples and rank not in self.reported_idle:
                self.reported_idle.add(rank)
                found.append(
                    (
                        "gpu_idle",
                        {"rank": rank, "gpu": s.index, "util": s.util, "peers_util": median(others), "samples": self.idle_for[rank]},
                    )
                )
            elif not idle:
                self.reported_idle.discard(rank)
            # an uncorrectable error since the driver loaded, before this job too: the GPU needs a reset
            before = self.ecc_seen.setdefault(s.index, 0)
            if s.ecc_uncorrected > before or s.xids:
                self.ecc_seen[s.index] = s.ecc_uncorrected
                found.append(
                    ("gpu_error", {"rank": rank, "gpu": s.index, "xids": list(s.xids), "ecc_uncorrected_new": s.ecc_uncorrected - before})
                )
        return found
