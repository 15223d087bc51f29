"""Which rank slows the job down: per-step timings in, straggler findings out. Pure.

Every rank measures each training step (``training.step_timing``): its wall time between two
step ends, the CPU time its training thread was busy (``compute``: the work of the step without
the time blocked in collectives, which equalises the wall times of all ranks), the wall time of
the phases it marks (``data``, ``eval``, ``checkpoint``) and the time blocked in the step's
synchronising collective. The same collective gives every rank the others' values of each
scored quantity at that step, so a rank knows the median of its peers, and a node's watchdog
scores its own ranks against the whole job without any extra message.

Scores are ratios of rolling medians, 0..1 (1: not slower than its peers; NVIDIA's resiliency
extension scores alike, with the best rank as the reference; the median of the peers is not
moved by one lucky rank):

- relative: the median of the other ranks / this rank's (a rank 1.5x slower scores 0.67);
- individual: this rank's best rolling median so far / its current one (a rank that slowed down).

A rolling median covers the last ``window`` steps and at least ``window_s`` seconds of steps
(at most ``max_window`` steps), and a rank is scored once its window is full. In seconds, not
only steps: a passing slowdown of the machine (a virtual CPU stolen or slowed for a second, a
neighbour's burst) shorter than half of it moves the median by nothing, whatever the step time
(with 0.06 s steps, 5 steps are 0.3 s, and a healthy rank once looked 1.33x slower for 5 steps
in a row in a CI run); and a median over many steps is steady where one over 5 short steps is
noise. A rank is a straggler in a quantity when its relative score stays below ``threshold``
for ``consecutive`` steps in a row and its excess over its peers is worth telling (at least
``min_share`` of its step's wall time and ``min_seconds``): a single stall (one slow batch, a
checkpoint) moves no median. Detection bound: ``StragglerPolicy.bound_steps`` (8 steps when 5
steps span 5 s; with shorter steps, the steps that fill 5 s plus 5), the one step a beat carries
its timing late included. ``checkpoint`` is measured but not scored: rank 0 commits, so it is
slower there by design.

A slow *link* slows every rank's collectives alike and leaves the compute as it was, so no rank
score shows it: ``slow_links`` compares the rates the nodes' watchdogs measure between each
other (``supervise.peer_links``) instead.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any

SCORED = ("compute", "data", "eval")  # the quantities compared between ranks
MARKED = ("data", "eval", "checkpoint")  # phases a rank times apart from its compute


@dataclass(frozen=True)
class StepTiming:
    """One rank's step: seconds, and its peers' median of each scored quantity at that step."""

    step: int
    wall: float  # between the ends of two step syncs (includes the sync's wait)
    compute: float  # CPU time of the training thread outside the marked phases
    sync_wait: float  # blocked in the step's synchronising collective
    phases: Mapping[str, float] = field(default_factory=dict)  # wall time in each marked phase
    peers: Mapping[str, float] = field(default_factory=dict)  # the other ranks' median per scored quantity

    @property
    def wait(self) -> float:
        """The step's time not spent computing or in a marked phase: blocked in collectives
        (FSDP's gathers included), waiting for the slowest rank."""
        return max(0.0, self.wall - self.compute - sum(self.phases.values()))

    def value(self, quantity: str) -> float:
        """Seconds of ``quantity`` in this step: the compute time for ``compute``, else the marked phase's
        wall time (0 when the phase did not run)."""
        return self.compute if quantity == "compute" else float(self.phases.get(quantity, 0.0))

    def to_wire(self) -> dict[str, Any]:
        """The heartbeat's form (JSON-ready, seconds rounded to the microsecond; phases that took no time left out)."""
        return {
            "step": self.step,
            "wall": round(self.wall, 6),
            "compute": round(self.compute, 6),
            "sync_wait": round(self.sync_wait, 6),
            "phases": {k: round(v, 6) for k, v in self.phases.items() if v},
            "peers": {k: round(v, 6) for k, v in self.peers.items()},
        }

    @staticmethod
    def from_wire(data: Any) -> StepTiming | None:
        """None for anything that is not a timing a rank sent (a beat is never trusted blindly)."""
        if not isinstance(data, dict):
            return None
        try:
            phases = {str(k): float(v) for k, v in dict(data.get("phases") or {}).items() if k in MARKED}
            peers = {str(k): float(v) for k, v in dict(data.get("peers") or {}).items() if k in SCORED}
            timing = StepTiming(int(data["step"]), float(data["wall"]), float(data["compute"]), float(data["sync_wait"]), phases, peers)
        except (KeyError, TypeError, ValueError):
            return None
        numbers = (timing.wall, timing.compute, timing.sync_wait, *phases.values(), *peers.values())
        return timing if all(0 <= x < 1e7 for x in numbers) else None


@dataclass(frozen=True)
class StragglerPolicy:
    """When a rank counts as a straggler. A rank's rolling median of a scored quantity is compared with its
    peers' (``score`` = peers / own): below ``threshold`` for ``consecutive`` steps in a row, and slower
    by at least ``min_seconds`` and ``min_share`` of the step's wall time, it is reported once. The
    window holds at least ``window`` steps and ``window_s`` seconds of steps, at most ``max_window``
    steps; the first ``warmup`` steps of each attempt are not scored. Raises ``ValueError`` for values
    out of range."""

    threshold: float = 0.75  # relative score below this is slow: 1.33x the peers' median
    window: int = 5  # steps in a rolling median, at least ...
    window_s: float = 5.0  # ... and at least this many seconds of steps (each counts up to window_s / window)
    max_window: int = 256  # ... and at most this many steps (the watchdog's cost: steps of ms)
    consecutive: int = 5  # steps in a row below the threshold before it is reported
    warmup: int = 3  # first steps of each attempt are not scored (allocation, compilation, resume)
    min_share: float = 0.05  # excess over the peers worth telling, as a share of the step's wall time
    min_seconds: float = 0.002

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"straggler threshold must be between 0 and 1 (a relative score), got {self.threshold}")
        if self.window < 1 or self.consecutive < 1 or self.warmup < 0 or self.max_window < self.window:
            raise ValueError("straggler window and consecutive must be >= 1, warmup >= 0, max_window >= window")
        if not 0 <= self.window_s <= 3600:
            raise ValueError(f"straggler seconds must be between 0 and 3600 (the span of a rolling median), got {self.window_s}")

    def bound_steps(self, step_s: float) -> int:
        """Steps from the first slow step to the report, at most (the beat's one step included),
        when the job's steps take ``step_s`` seconds once the rank is slow. The median turns when
        more than half the window is slow steps: after ``window // 2 + 1`` when ``window`` steps
        span ``window_s``; otherwise by the time slow steps alone fill ``window_s`` (sooner, as
        the faster steps before them leave the window)."""
        if self.window_s == 0:
            filling = self.window
        else:
            filling = math.ceil(self.window_s / self.counted(step_s)) if step_s > 0 else self.max_window
        turned = self.window // 2 + 1 if filling <= self.window else min(filling, self.max_window)
        return turned + self.consecutive

    def counted(self, wall: float) -> float:
        """A step's seconds in a window's span: a long stall counts as ``window`` steps' share,
        lest one 20 s step shrink the window back to 5 steps."""
        return min(wall, self.window_s / self.window)

    def full(self, steps: int, seconds: float) -> bool:
        """Whether a window of ``steps`` steps spanning ``seconds`` is enough to judge by."""
        return steps >= self.max_window or (steps >= self.window and seconds >= self.window_s)


@dataclass(frozen=True)
class RankScore:
    """A rank's standing over the last ``window`` steps (medians)."""

    rank: int
    step: int
    wall: float
    compute: float
    wait: float
    score: float  # the worst relative score over the scored quantities
    worst: str  # which quantity
    own: float  # its median in that quantity
    peers: float  # its peers' median in that quantity
    individual: float
    straggler: bool

    def to_json(self) -> dict[str, Any]:
        """A row of the node's rank-health table that ``ckpt status`` reads (seconds rounded to 0.1 ms, scores to 3 places)."""
        return {
            "rank": self.rank,
            "step": self.step,
            "wall_s": round(self.wall, 4),
            "compute_s": round(self.compute, 4),
            "wait_s": round(self.wait, 4),
            "score": round(self.score, 3),
            "worst": self.worst,
            "individual": round(self.individual, 3),
            "straggler": self.straggler,
        }


@dataclass(frozen=True)
class Finding:
    """``straggler`` (reported once per episode) or ``straggler_cleared``."""

    event: str
    rank: int
    phase: str
    step: int
    own_s: float
    peers_s: float
    score: float
    steps: int  # steps in a row below the threshold

    def to_json(self) -> dict[str, Any]:
        """The event's form for the run's events log: seconds, the peers' median, how many times slower
        (None when the peers took no time) and the steps in a row below the threshold."""
        return {
            "rank": self.rank,
            "phase": self.phase,
            "step": self.step,
            "time_s": round(self.own_s, 4),
            "peers_median_s": round(self.peers_s, 4),
            "slower_x": round(self.own_s / self.peers_s, 2) if self.peers_s > 0 else None,
            "score": round(self.score, 3),
            "steps_below": self.steps,
        }


@dataclass
class _Rank:
    recent: deque[StepTiming]
    seen: int = 0
    span: float = 0.0  # seconds of steps in ``recent`` (``StragglerPolicy.counted``)
    below: dict[str, int] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)
    best_own: dict[str, float] = field(default_factory=dict)  # lowest rolling median so far


class StragglerDetector:
    """Rolling statistics of the ranks one watchdog hears, and the findings they lead to."""

    def __init__(self, policy: StragglerPolicy | None = None) -> None:
        self.policy = policy or StragglerPolicy()
        self.ranks: dict[int, _Rank] = {}

    def reset(self) -> None:
        """A new attempt: new processes, a new warm-up."""
        self.ranks = {}

    def observe(self, rank: int, timing: StepTiming) -> list[Finding]:
        """Take one step of ``rank`` and return what it changes: a ``straggler`` finding when a scored
        quantity has been slow for ``policy.consecutive`` steps (once per episode), ``straggler_cleared``
        when a flagged one recovers; empty during warm-up and until the window is full."""
        p = self.policy
        r = self.ranks.setdefault(rank, _Rank(deque()))
        r.seen += 1
        if r.seen <= p.warmup:
            return []
        r.recent.append(timing)
        r.span += p.counted(timing.wall)
        while len(r.recent) > p.max_window or p.full(len(r.recent) - 1, r.span - p.counted(r.recent[0].wall)):
            r.span -= p.counted(r.recent.popleft().wall)  # the shortest window that is still full: once full, it stays so
        if not self._full(r):
            return []
        wall = median(t.wall for t in r.recent)
        found = []
        for q in SCORED:
            own, peers = self._medians(r, q)
            if own <= 0 or peers is None:
                continue
            r.best_own[q] = min(r.best_own.get(q, own), own)
            score = peers / own
            slow = score < p.threshold and own - peers >= max(p.min_seconds, p.min_share * wall)
            r.below[q] = r.below.get(q, 0) + 1 if slow else 0
            if slow and r.below[q] >= p.consecutive and q not in r.flagged:
                r.flagged.add(q)
                found.append(Finding("straggler", rank, q, timing.step, own, peers, score, r.below[q]))
            elif not slow and q in r.flagged:
                r.flagged.discard(q)
                found.append(Finding("straggler_cleared", rank, q, timing.step, own, peers, min(1.0, score), 0))
        return found

    def _full(self, r: _Rank) -> bool:
        return self.policy.full(len(r.recent), r.span)

    def _medians(self, r: _Rank, quantity: str) -> tuple[float, float | None]:
        """(this rank's median, its peers' median or None when no peer had the quantity)."""
        own = median(t.value(quantity) for t in r.recent)
        peers = [t.peers[quantity] for t in r.recent if quantity in t.peers]
        return own, median(peers) if peers else None

    def scores(self) -> list[RankScore]:
        """Each scored rank's standing (ranks whose window has not yet filled are left out)."""
        out = []
        for rank, r in sorted(self.ranks.items()):
            if not self._full(r):
                continue
            scored = []
            for q in SCORED:
                own, peers = self._medians(r, q)
                if own > 0 and peers is not None:
                    scored.append((min(1.0, peers / own), q, own, peers))
            score, worst, own, peers = min(scored, default=(1.0, "compute", 0.0, 0.0))
            current = self._medians(r, "compute")[0]
            individual = min(1.0, r.best_own.get("compute", current) / current) if current > 0 else 1.0
            last = r.recent[-1]
            out.append(
                RankScore(
                    rank,
                    last.step,
                    median(t.wall for t in r.recent),
                    current,
                    median(t.wait for t in r.recent),
                    score,
                    worst,
                    own,
                    peers,
                    individual,
                    bool(r.flagged),
                )
            )
        return out


# ----------------------------------------------------------------------------- links
SLOW_LINK_FACTOR = 0.25  # a node whose links carry under this share of the others' rate is slow
SLOW_LINK_CHECKS = 2  # ... in this many link checks in a row


def slow_links(rates: Mapping[str, Mapping[str, float]], factor: float = SLOW_LINK_FACTOR) -> dict[str, float]:
    """The nodes on a slow link, with their share of the others' rate, from one round of link
    checks (``rates[a][b]``: bytes/s that node ``a`` sent to node ``b``'s watchdog). A node is
    slow when the median rate of the transfers to and from it is under ``factor`` x the median of
    the transfers between the other nodes: a slow link slows every rank's collectives alike, so
    the ranks' compute cannot show it. Needs three nodes or more (with two, one link has two
    ends and nothing to compare with)."""
    nodes = sorted(set(rates) | {b for r in rates.values() for b in r})
    if len(nodes) < 3:
        return {}
    pairs = [(a, b, v) for a, r in rates.items() for b, v in r.items() if a != b and v > 0]
    out = {}
    for x in nodes:
        mine = [v for a, b, v in pairs if x in (a, b)]
        others = [v for a, b, v in pairs if x not in (a, b)]
        if not mine or not others:
            continue
        share = median(mine) / median(others)
        if share < factor:
            out[x] = round(share, 4)
    return out
