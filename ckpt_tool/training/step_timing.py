"""A rank's per-step timings, measured on every backend without a device sync or a message.

Under ``ckpt run`` every step already ends in one small synchronising collective (the manager's
"did any rank get a stop request?"). Around it this timer reads two clocks, at each step end and
at each marked phase's start and end: the wall clock and the CPU time of the training thread.
The collective's tensor grows by a slot per rank and scored quantity (each rank fills its own,
the maximum over the ranks then holds everyone's): every rank learns its peers' median at no
extra message, in a collective whose cost is its latency, not these few numbers. The finished
step's ``StepTiming`` rides on the rank's next beat to its node's watchdog.

What the clocks see: compute is CPU time, so a rank blocked in a collective (gloo, FSDP's
gathers) does not accrue it while its wall time runs on; a slower rank shows as more compute,
its peers as more wait. On a GPU the training thread's CPU time is kernel launches and
spin-waits, not the device's work: there the GPU-side signal is NVML's utilisation
(``supervise.gpu_monitor``). ``CKPT_STEP_TIMING=0`` turns the measurement off.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from ckpt_tool.core.stragglers import MARKED, SCORED, StepTiming

ENV_SWITCH = "CKPT_STEP_TIMING"
_ABSENT = -1.0  # another rank's slot, or a quantity this rank did not have this step


class StepTimer:
    """One rank's step clock (``rank`` of ``world_size``): wall and training-thread CPU time per step, and
    the wall time of each marked phase, read around the step's synchronising collective. Turned off by
    ``CKPT_STEP_TIMING=0`` (``ENV_SWITCH``); the first step is not timed (no start yet)."""

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        self.enabled = os.environ.get(ENV_SWITCH, "1") != "0"
        self.ready: StepTiming | None = None  # the last finished step, until a beat takes it
        self._start: tuple[float, float] | None = None  # (wall, cpu) at the last step end
        self._arrived: tuple[int, float, float, dict[str, float]] | None = None
        self._phase_wall: dict[str, float] = {}
        self._phase_cpu = 0.0
        self._open: tuple[str, float, float] | None = None
        self._depth = 0

    def enter(self, phase: str) -> None:
        """Start timing marked phase ``phase`` (``MARKED``; others are ignored). A marked phase inside
        another counts as the outer one's time."""
        if not self.enabled or self._start is None or phase not in MARKED:
            return
        self._depth += 1
        if self._depth == 1:  # a marked phase inside another is the outer one's time
            self._open = (phase, time.perf_counter(), time.thread_time())

    def leave(self, phase: str) -> None:
        """End the marked phase ``enter`` opened: its wall time is added to the step's phases and its CPU
        time taken out of the step's compute."""
        if not self.enabled or phase not in MARKED or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._open is not None:
            name, wall0, cpu0 = self._open
            self._phase_wall[name] = self._phase_wall.get(name, 0.0) + time.perf_counter() - wall0
            self._phase_cpu += time.thread_time() - cpu0
            self._open = None

    def arrive(self, step: int) -> list[float]:
        """At the step's synchronising collective: the numbers it reduces (maximum): this rank's
        values in its slots, ``_ABSENT`` elsewhere. Empty before the first step end."""
        if not self.enabled or self._start is None:
            return []
        wall0, cpu0 = self._start
        now, cpu = time.perf_counter(), time.thread_time()
        compute = max(0.0, cpu - cpu0 - self._phase_cpu)
        phases = dict(self._phase_wall)
        self._arrived = (step, now, compute, phases)
        values = {"compute": compute, **phases}
        mine = [values[q] if values.get(q, 0.0) > 0 else _ABSENT for q in SCORED]
        out = [_ABSENT] * (self.world_size * len(SCORED))
        out[self.rank * len(SCORED) : (self.rank + 1) * len(SCORED)] = mine
        return out

    def synced(self, reduced: list[float]) -> None:
        """After the collective: the step is complete; the next one starts now."""
        now, cpu = time.perf_counter(), time.thread_time()
        if self._arrived is not None and len(reduced) == self.world_size * len(SCORED):
            step, arrived, compute, phases = self._arrived
            assert self._start is not None
            self.ready = StepTiming(step, now - self._start[0], compute, now - arrived, phases, self.peers_median(reduced))
        self._start, self._arrived = (now, cpu), None
        self._phase_wall, self._phase_cpu = {}, 0.0

    def peers_median(self, reduced: list[float]) -> dict[str, float]:
        """The median (the lower of two middle values) of the other ranks' values of each scored
        quantity, over those that had it. Plain Python for a few ranks (~5 us), torch from 64
        ranks on (4096 ranks: ~2 ms)."""
        n = len(SCORED)
        if self.world_size < 64:
            columns = [[reduced[r * n + i] for r in range(self.world_size) if r != self.rank and reduced[r * n + i] >= 0] for i in range(n)]
            return {q: statistics.median_low(c) for q, c in zip(SCORED, columns, strict=True) if c}
        table = torch.tensor(reduced, dtype=torch.float64).view(self.world_size, n)
        table[table < 0] = float("nan")
        table[self.rank] = float("nan")
        medians = torch.nanmedian(table, dim=0).values.tolist()
        return {q: m for q, m in zip(SCORED, medians, strict=True) if m == m}  # NaN: no peer had it

    def take(self) -> StepTiming | None:
        """The last finished step's timings, once (the next call returns None until another step finishes)."""
        ready, self.ready = self.ready, None
        return ready
