"""What K hot spares buy a job, against shrinking and requeueing without them. Pure: no I/O, no torch.

The job trains on ``nodes`` (N) nodes and holds ``spares`` (K) more idle as standbys. Each node fails
as a Poisson process at 1 / ``node_mtbf_hours`` while it trains, and a failed node is lastingly bad:
the job leaves it behind. Every failure costs ``restart_seconds`` (R: detection, restart, load, and
the work lost since the last checkpoint). Then, in this order:

1. a standby is left: it replaces the bad node (same size, same speed on);
2. else, with at least ``min_nodes`` (M) nodes still good: the job shrinks by one node and trains on
   at a speed proportional to its nodes (``active / N``);
3. else it requeues: ``requeue_wait_hours`` (W) in the queue, then back at full size on a fresh
   allocation, with all K spares again.

Throughput and failure rate both scale with the active nodes, so the failures per hour of *work*
(full-size training hours) are ``N / MTBF`` in every state: their count over the ``job_hours`` (L)
of work is Poisson with mean ``N L / MTBF``, and what the i-th failure does (replace, shrink,
requeue) depends only on ``i``: the states repeat in a cycle of ``K + (N - M) + 1`` failures. The
expectations below are exact for that model (sums over the Poisson tail, no time slices), not a
simulation: deterministic, and well under a millisecond for jobs that fail a few hundred times.
Failures during a restart or the queue wait are not counted (the restart cost R covers them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Above this many expected failures per job the sums get slow (their window grows as its square root)
# and the plan means nothing: the inputs are off (hours for seconds, the job's MTBF for a node's).
MAX_EXPECTED_FAILURES = 1e6
_EXACT_HARMONIC = 100_000  # harmonic sums of up to this many terms are added up; longer ones use the expansion
_EULER_GAMMA = 0.5772156649015329


@dataclass(frozen=True)
class SparesScenario:
    """The expected outcome of one job (hours throughout): what went in, and the expected wall-clock
    ``wall_hours`` to finish, of which ``training_hours`` trained (on however many nodes), the expected
    ``failures`` and how they were met (``replacements`` by a standby, ``shrinks``, ``requeues``)."""

    nodes: int  # N: the nodes the job trains on at full size
    spares: int  # K: idle standbys held for the whole job
    min_nodes: int  # M: the fewest nodes it trains on before it requeues
    node_mtbf_hours: float
    job_hours: float  # L: the work, in hours of training at full size
    requeue_wait_hours: float
    restart_seconds: float
    wall_hours: float
    training_hours: float
    failures: float
    replacements: float
    shrinks: float
    requeues: float

    @property
    def goodput(self) -> float:
        """Training goodput: the work over the wall time (``L / wall``); 1 without failures."""
        return self.job_hours / self.wall_hours

    @property
    def node_hours(self) -> float:
        """Node-hours the job holds: its N + K nodes for the whole wall time (idle spares included)."""
        return (self.nodes + self.spares) * self.wall_hours

    @property
    def node_hour_efficiency(self) -> float:
        """Useful node-hours (``N L``) over those held (``(N + K) wall``): what failures and the idle
        spares cost; ``N / (N + K)`` without failures."""
        return self.nodes * self.job_hours / self.node_hours

    @property
    def mean_nodes_active(self) -> float:
        """The mean number of nodes training while the job trains (``N L / training_hours``): below N
        where it shrank."""
        return self.nodes * self.job_hours / self.training_hours


@dataclass(frozen=True)
class SparesComparison:
    """The job with its K spares and without any (same N, M, W, R), and which is better: by
    node-hour efficiency and by wall time (``"spares"``, ``"no spares"`` or ``"tie"``)."""

    with_spares: SparesScenario
    without: SparesScenario
    better_by_node_hours: str
    better_by_wall: str

    @property
    def wall_hours_saved(self) -> float:
        """Expected wall-clock hours the spares save (negative: they cost time, which they cannot)."""
        return self.without.wall_hours - self.with_spares.wall_hours

    @property
    def node_hours_extra(self) -> float:
        """The spares' node-hours over those of the job without them, as a fraction: 0.1 = 10% more
        (negative: the spares save node-hours, e.g. by sparing requeues)."""
        return self.with_spares.node_hours / self.without.node_hours - 1


def expected_failures(nodes: int, node_mtbf_hours: float, job_hours: float) -> float:
    """The expected failures of a job of ``job_hours`` of full-size work on ``nodes`` nodes: ``N L / MTBF``
    (shrinking changes nothing: fewer nodes fail less often and train as much slower)."""
    return nodes * job_hours / node_mtbf_hours


def _harmonic(n: int) -> float:
    """``H(n) = 1 + 1/2 + ... + 1/n`` (0 for n <= 0)."""
    if n <= 0:
        return 0.0
    if n <= _EXACT_HARMONIC:
        return math.fsum(1.0 / k for k in range(1, n + 1))
    return math.log(n) + _EULER_GAMMA + 1 / (2 * n) - 1 / (12 * n * n)


class _Cycle:
    """The states of a job between two fresh allocations. Position ``p`` (0 .. K + N - M) is the state
    after ``p`` failures of the allocation: full size for ``p <= K`` (the spares replace), then N - 1
    down to M nodes. The failure met in position ``p`` replaces for ``p < K``, shrinks for
    ``p < K + N - M``, else requeues."""

    def __init__(self, nodes: int, spares: int, min_nodes: int) -> None:
        self.n, self.k, self.shrinkable = nodes, spares, nodes - min_nodes
        self.length = spares + self.shrinkable + 1

    def kind(self, p: int) -> int:
        """0: replacement, 1: shrink, 2: requeue."""
        return 0 if p < self.k else (1 if p < self.k + self.shrinkable else 2)

    def slowdown(self, p: int) -> float:
        """Wall hours per hour of work in position ``p``: ``N / active``."""
        return 1.0 if p <= self.k else self.n / (self.n - (p - self.k))

    def first(self, r: int) -> tuple[float, float, float, float]:
        """Over positions 0 .. r-1: (replacements, shrinks, requeues, sum of the slowdowns)."""
        full = min(r, self.k + 1)
        shrunk = max(0, r - full)  # positions K+1 .. r-1: N-1 down to N-shrunk nodes
        slow = full + self.n * (_harmonic(self.n - 1) - _harmonic(self.n - 1 - shrunk))
        return float(min(r, self.k)), float(min(max(0, r - self.k), self.shrinkable)), float(r == self.length), slow


def _poisson_tails(mean: float, lo: int, hi: int) -> list[float]:
    """``P(F >= i)`` for ``i = lo+1 .. hi`` with ``F ~ Poisson(mean)``, summed from the top (no cancellation);
    ``hi`` lies far enough above the mean that the mass beyond it is negligible."""
    log_mean = math.log(mean)
    pmf = [math.exp(k * log_mean - mean - math.lgamma(k + 1)) for k in range(lo + 1, hi + 1)]
    tails = [0.0] * len(pmf)
    acc = 0.0
    for j in range(len(pmf) - 1, -1, -1):
        acc += pmf[j]
        tails[j] = acc
    if lo == 0:  # P(F >= 1) = 1 - e^-mean exactly, for the smallest rates too
        scale = -math.expm1(-mean) / tails[0] if tails[0] > 0 else 0.0
        tails = [t * scale for t in tails]
    return tails


def model_spares(
    nodes: int,
    spares: int,
    node_mtbf_hours: float,
    job_hours: float,
    min_nodes: int | None = None,
    requeue_wait_hours: float = 1.0,
    restart_seconds: float = 300.0,
) -> SparesScenario:
    """The expected outcome of a job of ``job_hours`` of full-size work on ``nodes`` nodes with
    ``spares`` standbys (the model in the module docstring). ``min_nodes`` defaults to ``nodes``
    (no shrink: a failure with no spare left requeues). Raises ``ValueError`` for inputs outside the
    model (the CLI checks them first and names the option)."""
    min_nodes = nodes if min_nodes is None else min_nodes
    if nodes < 1 or spares < 0 or not 1 <= min_nodes <= nodes:
        raise ValueError(f"need nodes >= 1, spares >= 0 and 1 <= min_nodes <= nodes, got {nodes}, {spares}, {min_nodes}")
    for name, value, zero_ok in (
        ("node_mtbf_hours", node_mtbf_hours, False),
        ("job_hours", job_hours, False),
        ("requeue_wait_hours", requeue_wait_hours, True),
        ("restart_seconds", restart_seconds, True),
    ):
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise ValueError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} finite number, got {value!r}")
    mean = expected_failures(nodes, node_mtbf_hours, job_hours)
    if mean > MAX_EXPECTED_FAILURES:
        raise ValueError(f"{mean:.3g} expected failures per job is beyond the model (at most {MAX_EXPECTED_FAILURES:g})")
    cycle = _Cycle(nodes, spares, min_nodes)
    kinds = [0.0, 0.0, 0.0]  # expected replacements, shrinks, requeues
    # sum over the states i = 0, 1, ... of P(the job reaches failure i+1) x (N / active in state i);
    # x MTBF / N: the expected wall hours it trains (the work spent in state i is MTBF/N x P(F >= i+1))
    slow = 0.0
    if mean > 0:
        spread = 12 * math.sqrt(mean) + 30
        lo, hi = max(0, math.floor(mean - spread)), math.ceil(mean + spread)
        # failures 1 .. lo happen almost surely (P(F >= i) = 1 to double precision): whole cycles and a rest
        whole, rest = divmod(lo, cycle.length)
        for counts, times in ((cycle.first(cycle.length), whole), (cycle.first(rest), 1)):
            for j in range(3):
                kinds[j] += counts[j] * times
            slow += counts[3] * times
        for offset, tail in enumerate(_poisson_tails(mean, lo, hi)):
            p = (lo + offset) % cycle.length  # failure lo+1+offset is met in this position
            kinds[cycle.kind(p)] += tail
            slow += tail * cycle.slowdown(p)
        training = slow * node_mtbf_hours / nodes
    else:  # no failure in double precision
        training = job_hours
    replacements, shrinks, requeues = kinds
    failures = replacements + shrinks + requeues
    wall = training + failures * restart_seconds / 3600 + requeues * requeue_wait_hours
    return SparesScenario(
        nodes,
        spares,
        min_nodes,
        node_mtbf_hours,
        job_hours,
        requeue_wait_hours,
        restart_seconds,
        wall,
        training,
        failures,
        replacements,
        shrinks,
        requeues,
    )


def _better(spares_value: float, none_value: float, higher_is_better: bool) -> str:
    if math.isclose(spares_value, none_value, rel_tol=1e-9, abs_tol=1e-12):
        return "tie"
    return "spares" if (spares_value > none_value) == higher_is_better else "no spares"


def compare_spares(
    nodes: int,
    spares: int,
    node_mtbf_hours: float,
    job_hours: float,
    min_nodes: int | None = None,
    requeue_wait_hours: float = 1.0,
    restart_seconds: float = 300.0,
) -> SparesComparison:
    """The job with ``spares`` standbys and with none (same ``min_nodes``, queue wait and restart cost),
    and which is better by node-hour efficiency and by wall time. Raises ``ValueError`` as
    ``model_spares`` does."""
    args = (node_mtbf_hours, job_hours, min_nodes, requeue_wait_hours, restart_seconds)
    with_spares = model_spares(nodes, spares, *args)
    without = model_spares(nodes, 0, *args)
    return SparesComparison(
        with_spares,
        without,
        _better(with_spares.node_hour_efficiency, without.node_hour_efficiency, higher_is_better=True),
        _better(with_spares.wall_hours, without.wall_hours, higher_is_better=False),
    )
