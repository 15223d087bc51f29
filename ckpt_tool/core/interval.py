"""Checkpoint-interval planning (Young/Daly). Pure.

With checkpoint cost C, restart cost R and mean time between failures M (seconds):
- Young's first-order optimum of the compute time between checkpoints: sqrt(2 C M);
- Daly's higher-order optimum (J. T. Daly, "A higher order estimate of the optimum checkpoint
  interval for restart dumps", FGCS 2006): for C < 2M,
  tau = sqrt(2 C M) x [1 + (1/3) sqrt(C / 2M) + (1/9) (C / 2M)] - C, else tau = M;
- Daly's expected wall time per unit of work gives the goodput of an interval tau:
  goodput(tau) = tau / (M e^(R/M) (e^((tau + C)/M) - 1)).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tool.errors import CkptError, ExitCode

DAY_S = 86400.0
# Below this expected goodput no interval is worth recommending: the job would barely train.
MIN_GOODPUT = 0.01


@dataclass(frozen=True)
class IntervalPlan:
    """The Young/Daly plan for one tier, all in seconds: what went in (checkpoint cost, MTBF, restart cost,
    the step time when known) and what came out (``interval_s``: Daly's compute time between checkpoints,
    ``young_s``: Young's first-order one, ``goodput``: the share of the time spent on training that is
    kept)."""

    checkpoint_s: float
    mtbf_s: float
    restart_s: float
    interval_s: float  # compute seconds between checkpoints (Daly)
    young_s: float
    goodput: float
    step_s: float | None = None

    @property
    def works(self) -> bool:
        """Whether any interval trains for a worthwhile share of the time (``MIN_GOODPUT``)."""
        return self.goodput >= MIN_GOODPUT

    @property
    def interval_steps(self) -> int | None:
        """Daly's interval as training steps (at least 1); None when the step time is unknown."""
        return None if self.step_s is None else max(1, round(self.interval_s / self.step_s))


def _check(name: str, value: float, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise CkptError(f"{name} must be a positive number of seconds or hours, got {value!r}", "see `ckpt plan --help`", ExitCode.USAGE)


def goodput(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Useful compute / wall time, Daly's model (failures during checkpoints and restarts included);
    0 where the model's exponentials overflow (costs of many MTBFs: nothing gets done)."""
    try:
        return interval_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + checkpoint_s) / mtbf_s))
    except OverflowError:
        return 0.0


def plan_interval(checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0, step_s: float | None = None) -> IntervalPlan:
    """Daly's interval for a checkpoint costing ``checkpoint_s`` seconds at an MTBF of ``mtbf_s`` (the MTBF
    itself once the cost reaches twice the MTBF), with Young's and the goodput. Raises ``CkptError``
    (USAGE) for a time that is not a positive number (``restart_s`` may be 0)."""
    _check("checkpoint time", checkpoint_s)
    _check("MTBF", mtbf_s)
    _check("restart time", restart_s, allow_zero=True)
    if step_s is not None:
        _check("step time", step_s)
    young = math.sqrt(2 * checkpoint_s * mtbf_s)
    if checkpoint_s < 2 * mtbf_s:
        r = checkpoint_s / (2 * mtbf_s)
        tau = young * (1 + math.sqrt(r) / 3 + r / 9) - checkpoint_s
    else:
        tau = mtbf_s
    return IntervalPlan(checkpoint_s, mtbf_s, restart_s, tau, young, goodput(tau, checkpoint_s, mtbf_s, restart_s), step_s)


def waste_table(plan: IntervalPlan, factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)) -> list[tuple[float, float, float]]:
    """(interval seconds, goodput, wasted hours per day) around the optimum."""
    rows = []
    for f in factors:
        tau = plan.interval_s * f
        g = goodput(tau, plan.checkpoint_s, plan.mtbf_s, plan.restart_s)
        rows.append((tau, g, (1 - g) * DAY_S / 3600))
    return rows


@dataclass(frozen=True)
class TwoTierPlan:
    """A fast tier (node-local saves with a peer copy) beside the shared one. The failures the
    fast tier covers (``covered``: those that take at most ``local_replicas`` nodes) are met by
    its interval, cost and restart; the rest (several nodes at once, the whole job) by the shared
    tier's, at the MTBF of those failures alone. Goodput is the product of the two levels' (the
    first-order model of multi-level checkpointing: each level's checkpoints and rework take
    their fraction of the time); ``shared_only`` is the plan without the fast tier."""

    local: IntervalPlan
    shared: IntervalPlan
    covered: float
    shared_only: IntervalPlan

    @property
    def goodput(self) -> float:
        """The share of the time that trains with both tiers: the product of the two levels' goodput."""
        return self.local.goodput * self.shared.goodput


def plan_two_tier(
    shared_s: float, local_s: float, mtbf_s: float, restart_s: float, local_restart_s: float, covered: float, step_s: float | None = None
) -> TwoTierPlan:
    """Plan both tiers: the fast tier at the MTBF of the failures it covers (``mtbf_s / covered``), the
    shared tier at that of the rest, and the shared tier alone for comparison. Seconds throughout. Raises
    ``CkptError`` (USAGE) unless ``0 < covered < 1``."""
    if not 0 < covered < 1:
        raise CkptError(
            f"the share of failures the fast tier covers must be between 0 and 1 (exclusive), got {covered!r}",
            "e.g. --local-covers 0.9: nine failures in ten take one node",
            ExitCode.USAGE,
        )
    local = plan_interval(local_s, mtbf_s / covered, local_restart_s, step_s)
    shared = plan_interval(shared_s, mtbf_s / (1 - covered), restart_s, step_s)
    return TwoTierPlan(local, shared, covered, plan_interval(shared_s, mtbf_s, restart_s, step_s))


@dataclass(frozen=True)
class StepTime:
    """Seconds per training step measured in a run, and where the number came from."""

    seconds: float
    source: str  # "rank step timings" or "commit spacing"
    detail: str  # what it was computed from, for the user


def measured_step_time(
    rank_rows: Iterable[Mapping[str, Any]], commits: Iterable[Mapping[str, Any]], checkpoint_s: float = 0.0
) -> StepTime | None:
    """The run's step time from what the ranks measured, best source first:

    1. the ranks' own step timings (``rank_health.*.json`` rows: each rank's median wall time
       per step over its window; the median over the ranks);
    2. the spacing of the commits in the checkpoint index (``created_at`` and ``step`` of
       consecutive commits of one run: seconds per step between them, less the blocked
       ``checkpoint_s`` of the one checkpoint in each gap; the median over the gaps, so a gap
       that holds a restart does not count).

    Not the phase spans of ``timeouts.json``: about half of them are fragments of a few ms at
    phase switches, their median is several times too short. None when neither source has data.
    """
    walls = [float(r["wall_s"]) for r in rank_rows if isinstance(r.get("wall_s"), (int, float)) and r["wall_s"] > 0]
    if walls:
        seconds = statistics.median(walls)
        return StepTime(seconds, "rank step timings", f"median of {len(walls)} rank(s)' step wall times (rank_health.*.json)")
    points = sorted(
        (float(c["created_at"]), c["step"], c.get("run_id"))
        for c in commits
        if isinstance(c.get("created_at"), (int, float)) and isinstance(c.get("step"), int) and not isinstance(c.get("step"), bool)
    )
    rates = []
    for (t0, s0, r0), (t1, s1, r1) in zip(points, points[1:], strict=False):
        if s1 > s0 and r0 == r1 and t1 - t0 - checkpoint_s > 0:
            rates.append((t1 - t0 - checkpoint_s) / (s1 - s0))
    if not rates:
        return None
    less = f", less {checkpoint_s:g} s of checkpoint each" if checkpoint_s else ""
    return StepTime(statistics.median(rates), "commit spacing", f"median over {len(rates)} gap(s) between commits in index.jsonl{less}")
