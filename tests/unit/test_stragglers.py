"""Straggler scores (core.stragglers) and the rank-side step timer (training.step_timing). Pure:
timings in, findings out; the timer's clocks are the real ones."""

from __future__ import annotations

import random
import time

import pytest

from ckpt_tool.core.stragglers import StepTiming, StragglerDetector, StragglerPolicy
from ckpt_tool.training.step_timing import StepTimer

POLICY = StragglerPolicy()


def job(detector: StragglerDetector, steps: range, compute: dict[int, float], jitter: float = 0.0, seed: int = 0, **phases_at):
    """Feed ``detector`` the timings of every rank for ``steps``: compute seconds per rank (times
    a random factor within +-jitter), each rank's peers' median computed as a rank would."""
    rng = random.Random(seed)
    findings = []
    for step in steps:
        own = {r: c * (1 + rng.uniform(-jitter, jitter)) for r, c in compute.items()}
        data = {r: phases_at.get("data", {}).get((r, step), 0.001) for r in compute}
        wall = max(own[r] + data[r] for r in compute) + 0.01
        for r in compute:
            others = sorted(v for q, v in own.items() if q != r)
            peers_data = sorted(v for q, v in data.items() if q != r)
            timing = StepTiming(
                step,
                wall,
                own[r],
                0.001,
                {"data": data[r]},
                {"compute": others[(len(others) - 1) // 2], "data": peers_data[(len(peers_data) - 1) // 2]},
            )
            findings += detector.observe(r, timing)
    return findings


@pytest.mark.parametrize(
    "factor, compute, bound",
    [
        (1.5, 1.0, 8),  # 1.5 s steps: 5 span the 5 s; 3 for the median to turn + 4 more in a row + 1 for the beat
        (3.0, 1.0, 8),
        (1.5, 0.3, 17),  # 0.45-0.47 s steps: 12 of them fill 5 s (the median turns sooner), + 5
        (3.0, 0.3, 11),  # 0.9 s steps: 6, + 5
    ],
)
def test_a_slow_rank_is_named_within_the_stated_bound(factor, compute, bound):
    d = StragglerDetector(POLICY)
    before = job(d, range(1, 21), {0: compute, 1: compute, 2: compute, 3: compute}, jitter=0.03)
    assert before == []
    after = job(d, range(21, 51), {0: compute, 1: compute, 2: compute * factor, 3: compute}, jitter=0.03)
    assert [(f.event, f.rank, f.phase) for f in after] == [("straggler", 2, "compute")]
    assert POLICY.bound_steps(compute * factor * 0.97 + 0.011) == bound  # the shortest slow step job() makes
    assert after[0].step - 21 + 1 <= bound - 1  # the beat that carries it adds the last step
    assert after[0].to_json()["slower_x"] == pytest.approx(factor, rel=0.1)
    standing = {s.rank: s for s in d.scores()}
    assert standing[2].straggler and standing[2].score < POLICY.threshold and standing[2].individual < 0.8
    assert not standing[0].straggler and standing[0].score > 0.9


def test_noise_a_slightly_slower_rank_and_one_long_stall_are_not_stragglers():
    d = StragglerDetector(POLICY)
    stall = {"data": {(1, 50): 20.0, (3, 120): 5.0}}  # a data loader stalled once on a shared filesystem
    found = job(d, range(1, 301), {0: 0.3, 1: 0.3, 2: 0.36, 3: 0.3}, jitter=0.10, seed=7, **stall)  # 1.2x: slower, not a straggler
    assert found == []


def test_medians_over_seconds_are_steadier_than_over_five_steps():
    """+-15% noise on every step and a rank 1.2x slower (score 0.83, near the 0.75 threshold), 20
    seeded jobs of 300 steps: medians over 5 s of steps mistake it for a straggler in 1, medians over
    5 steps (before 5 s windows) in 12."""
    stall = {"data": {(1, 50): 20.0, (3, 120): 5.0}}

    def flagged(policy: StragglerPolicy) -> int:
        jobs = [job(StragglerDetector(policy), range(1, 301), {0: 0.3, 1: 0.3, 2: 0.36, 3: 0.3}, 0.15, seed, **stall) for seed in range(20)]
        return sum(any(f.event == "straggler" for f in found) for found in jobs)

    assert flagged(POLICY) <= 3 < 10 <= flagged(StragglerPolicy(window_s=0))


def test_a_rank_that_recovers_is_cleared_and_can_be_reported_again():
    d = StragglerDetector(POLICY)
    assert [f.event for f in job(d, range(1, 30), {0: 0.1, 1: 0.3})] == ["straggler"]
    assert [f.event for f in job(d, range(30, 50), {0: 0.1, 1: 0.1})] == ["straggler_cleared"]
    assert [f.event for f in job(d, range(50, 90), {0: 0.1, 1: 0.3})] == ["straggler"]


def test_a_hiccup_shorter_than_half_the_window_is_not_a_straggler():
    """Fast steps (0.06 s, as the CPU recipe's): one rank 1.6x slower for 2 s (a virtual CPU slowed
    by its host: 22 steps, far more than 5 in a row) is not reported; for 8 s it is, within the
    bound. A median over 5 steps (0.3 s) would have reported the 2 s too."""
    for seconds, expected in ((2.0, []), (8.0, ["straggler"])):
        d = StragglerDetector(POLICY)
        assert job(d, range(1, 121), {0: 0.05, 1: 0.05}) == []  # 7 s: the windows are full
        assert {s.rank for s in d.scores()} == {0, 1}
        slow_steps = round(seconds / (0.08 + 0.011))
        found = job(d, range(121, 121 + slow_steps), {0: 0.05, 1: 0.08})
        found += job(d, range(121 + slow_steps, 300), {0: 0.05, 1: 0.05})
        assert [f.event for f in found if f.event == "straggler"] == expected, seconds
        if expected:
            [report] = [f for f in found if f.event == "straggler"]
            assert report.step - 121 + 1 <= POLICY.bound_steps(0.091) - 1
    assert StragglerPolicy(window_s=0).bound_steps(0.091) == 8  # 5-step medians, as before
    short = StragglerDetector(StragglerPolicy(window_s=0))
    job(short, range(1, 121), {0: 0.05, 1: 0.05})
    assert [f.event for f in job(short, range(121, 143), {0: 0.05, 1: 0.08})] == ["straggler"]


def test_one_long_stall_does_not_shrink_the_window():
    """A 20 s step counts as 1 s of the window's 5: the median stays over ~80 steps of 0.06 s,
    and a rank 1.6x slower for 2 s right after it is still a hiccup."""
    d = StragglerDetector(POLICY)
    job(d, range(1, 121), {0: 0.05, 1: 0.05}, data={(0, 120): 20.0, (1, 120): 20.0})
    assert job(d, range(121, 143), {0: 0.05, 1: 0.08}) == []


def test_a_small_absolute_excess_is_not_worth_telling():
    """Data loading 3x slower on one rank, but 3 ms in a 300 ms step: below min_share (5%)."""
    d = StragglerDetector(POLICY)
    slow_data = {"data": {(1, s): 0.003 for s in range(1, 60)}}
    assert job(d, range(1, 60), {0: 0.3, 1: 0.3}, **slow_data) == []


def test_a_phase_no_peer_has_is_not_scored():
    """Only rank 0 evaluates: nobody to compare its eval time with."""
    d = StragglerDetector(POLICY)
    for step in range(1, 40):
        for r in (0, 1):
            phases = {"eval": 2.0} if r == 0 else {}
            peers = {"compute": 0.3} if r == 0 else {"compute": 0.3, "eval": 2.0}
            assert d.observe(r, StepTiming(step, 2.4, 0.3, 0.0, phases, peers)) == []


def test_warm_up_and_a_new_attempt_are_not_scored():
    d = StragglerDetector(StragglerPolicy(warmup=3, window=2, consecutive=1, window_s=0))
    first = [d.observe(1, StepTiming(s, 1.0, 0.9, 0.0, {}, {"compute": 0.1})) for s in range(1, 5)]
    assert [len(f) for f in first] == [0, 0, 0, 0]  # steps 1-3 warm-up, step 4 fills the window
    assert d.observe(1, StepTiming(5, 1.0, 0.9, 0.0, {}, {"compute": 0.1}))[0].event == "straggler"
    d.reset()
    assert d.observe(1, StepTiming(6, 1.0, 0.9, 0.0, {}, {"compute": 0.1})) == [] and d.scores() == []


@pytest.mark.parametrize(
    "wire",
    [
        None,
        "x",
        {},
        {"step": 1},
        {"step": "a", "wall": 1, "compute": 1, "sync_wait": 0},
        {"step": 1, "wall": -1, "compute": 1, "sync_wait": 0},
        {"step": 1, "wall": 1, "compute": 1, "sync_wait": 0, "peers": {"compute": "nan?"}},
        {"step": 1, "wall": 1e300, "compute": 1, "sync_wait": 0},
    ],
)
def test_a_timing_that_is_not_one_is_dropped(wire):
    assert StepTiming.from_wire(wire) is None


def test_a_timing_round_trips_and_unknown_phases_are_dropped():
    t = StepTiming(3, 0.5, 0.3, 0.01, {"data": 0.05}, {"compute": 0.28})
    assert StepTiming.from_wire(t.to_wire()) == t
    assert t.wait == pytest.approx(0.15)
    assert StepTiming.from_wire({**t.to_wire(), "phases": {"data": 0.05, "bogus": 1}}) == t


@pytest.mark.parametrize(
    "kw",
    [
        {"threshold": 0},
        {"threshold": 1.2},
        {"window": 0},
        {"consecutive": 0},
        {"warmup": -1},
        {"window_s": -1},
        {"window_s": float("nan")},
    ],
)
def test_a_policy_that_cannot_work_is_refused(kw):
    with pytest.raises(ValueError):
        StragglerPolicy(**kw)


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_timer_counts_cpu_work_as_compute_and_waiting_as_wait():
    timer = StepTimer(rank=1, world_size=3)
    assert timer.arrive(1) == []  # before the first step end: nothing to measure
    timer.synced([])
    spin(0.05)
    time.sleep(0.1)  # blocked (a collective waiting for a peer): wall time, no compute
    timer.enter("data")
    spin(0.02)
    timer.leave("data")
    values = timer.arrive(2)
    assert len(values) == 3 * 3 and values[:3] == [-1.0] * 3 and values[6:] == [-1.0] * 3  # only rank 1's slots
    compute, data, ev = values[3:6]
    assert 0.045 <= compute <= 0.09 and 0.015 <= data and ev == -1.0  # no eval this step
    peers = [0.2, 0.01, -1.0, *values[3:6], 0.4, 0.03, 5.0]  # what the maximum over the ranks returns
    timer.synced(peers)
    t = timer.take()
    assert t is not None and timer.take() is None  # one beat carries it
    assert t.step == 2 and t.wall >= 0.17 and t.wait >= 0.09
    assert t.peers["compute"] == pytest.approx(0.2) and t.peers["data"] == pytest.approx(0.01) and t.peers["eval"] == 5.0


def test_the_timer_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("CKPT_STEP_TIMING", "0")
    timer = StepTimer(0, 2)
    timer.synced([])
    assert timer.arrive(1) == []
    timer.synced([])
    assert timer.take() is None


@pytest.mark.parametrize("world", [2, 5, 64, 300])
def test_the_peers_median_is_the_same_whether_computed_in_python_or_torch(world):
    rng = random.Random(world)
    reduced = [rng.choice([-1.0, rng.uniform(0, 1)]) for _ in range(world * 3)]
    reduced[0] = -1.0  # rank 0 had no compute this step: its peers still have theirs
    timer = StepTimer(rank=1, world_size=world)
    got = timer.peers_median(reduced)
    for i, q in enumerate(("compute", "data", "eval")):
        values = sorted(reduced[r * 3 + i] for r in range(world) if r != 1 and reduced[r * 3 + i] >= 0)
        if values:
            assert got[q] == values[(len(values) - 1) // 2]
        else:
            assert q not in got


def test_a_node_on_a_slow_link_is_named_with_its_share_of_the_others_rate():
    from ckpt_tool.core.stragglers import slow_links

    fast, slow = 400e6, 0.5e6  # bytes/s: the bridge, and a 4 Mbit/s link
    rates = {"n1": {"n2": slow, "n3": fast}, "n2": {"n1": slow, "n3": slow}, "n3": {"n1": fast * 0.8, "n2": slow}}
    assert slow_links(rates) == {"n2": round(slow / (fast * 0.9), 4)}
    assert slow_links({"n1": {"n2": slow}, "n2": {"n1": slow}}) == {}  # two nodes: one link, two ends
    noisy = {"n1": {"n2": fast * 0.4, "n3": fast}, "n2": {"n1": fast * 0.5, "n3": fast * 0.6}, "n3": {"n1": fast, "n2": fast * 0.7}}
    assert slow_links(noisy) == {}  # a loaded machine's spread is not a slow link
    failed = {"n1": {"n2": 0.0, "n3": fast}, "n3": {"n1": fast, "n2": 0.0}}
    assert slow_links(failed) == {}  # failed transfers (0) are not rates: the hang report's business
    assert slow_links({}) == {}
