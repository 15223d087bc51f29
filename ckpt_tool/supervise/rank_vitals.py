"""What a node's watchdog sees of its ranks beyond beats: straggler scores and GPU readings.

The ranks' step timings arrive on their beats (``training.step_timing``), already holding their
peers' medians across the whole job; ``core.stragglers`` keeps the rolling statistics and says
when a rank straggles. Once a second the node's GPUs are read (``supervise.gpu_monitor``) and
``core.gpu_findings`` says which rank's GPU idles while its peers work, and which reported a
hardware error. The findings go back to the watchdog as events; every two seconds the standing
of this node's ranks is written to ``RUN_DIR/rank_health.NODE.json`` for ``ckpt status``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ckpt_tool.core.gpu_findings import GpuSample, GpuWatch
from ckpt_tool.core.run_catalog import RANK_HEALTH_PATTERN
from ckpt_tool.core.stragglers import RankScore, StepTiming, StragglerDetector, StragglerPolicy
from ckpt_tool.supervise.gpu_monitor import GpuReader, device_of_local_rank
from ckpt_tool.supervise.run_dir import read_rank_health, write_rank_health

__all__ = ["HEALTH_FILE", "RankHealth", "read_rank_health"]
HEALTH_FILE = RANK_HEALTH_PATTERN
GPU_EVERY_S = 1.0
WRITE_EVERY_S = 2.0

Found = list[tuple[str, dict[str, Any]]]


class RankHealth:
    """One node's watchdog's view of its ranks: straggler scores from their beats' step timings and
    GPU findings from the readings; written to ``rank_health.NODE.json`` for ``ckpt status``."""

    def __init__(self, run_dir: Path, node: str, policy: StragglerPolicy, reader: GpuReader | None, cuda_visible: str | None) -> None:
        self.run_dir = run_dir
        self.node = node
        self.detector = StragglerDetector(policy)
        self.reader = reader
        self.cuda_visible = cuda_visible
        self.gpu = GpuWatch()
        self.gpus: dict[int, GpuSample] = {}  # rank -> its GPU's last reading
        self.attempt = 0
        self._read_at = self._written_at = float("-inf")

    def on_timing(self, rank: int, raw: Any) -> Found:
        """A beat's timing (not trusted: anything malformed is dropped)."""
        timing = StepTiming.from_wire(raw)
        if timing is None:
            return []
        return [(f.event, f.to_json()) for f in self.detector.observe(rank, timing)]

    def new_attempt(self, attempt: int) -> None:
        """Start over for a new torchrun attempt: the old ranks' timings and GPUs no longer count."""
        self.attempt = attempt
        self.detector.reset()
        self.gpus = {}

    def poll(self, now: float, local_ranks: dict[int, int]) -> Found:
        """``local_ranks``: rank -> local rank of this node's current ranks."""
        found: Found = []
        if self.reader is not None and now - self._read_at >= GPU_EVERY_S:
            self._read_at = now
            found = self._read_gpus(local_ranks)
        if now - self._written_at >= WRITE_EVERY_S:
            self._written_at = now
            self.write()
        return found

    def _read_gpus(self, local_ranks: dict[int, int]) -> Found:
        assert self.reader is not None
        samples = self.reader.sample()
        self.gpus = {}
        for rank, local in local_ranks.items():
            index = self.reader.index_of(device_of_local_rank(local, self.cuda_visible))
            if index is not None and index in samples:
                self.gpus[rank] = samples[index]
        return self.gpu.observe(self.gpus)

    def scores(self) -> list[RankScore]:
        """Each rank's straggler score so far (ranks whose window has not filled are left out)."""
        return self.detector.scores()

    def table(self) -> dict[str, Any]:
        """This node's ranks' standing as ``rank_health.NODE.json`` holds it: scores, GPU use, the time."""
        rows = []
        for s in self.scores():
            row = s.to_json()
            if s.rank in self.gpus:
                row["gpu_util"] = self.gpus[s.rank].util
            rows.append(row)
        return {"node": self.node, "time": time.time(), "attempt": self.attempt, "ranks": rows, "gpu_monitor": self.reader is not None}

    def write(self) -> None:
        """Best effort: it informs ``ckpt status``; nothing depends on it."""
        write_rank_health(self.run_dir, self.node, self.table())

    def close(self) -> None:
        """Write the table a last time and release the GPU reader."""
        self.write()
        if self.reader is not None:
            self.reader.close()
