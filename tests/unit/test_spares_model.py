"""core.spares_model: what K hot spares buy against shrinking and requeueing, as plain numbers."""

from __future__ import annotations

import random
import time

import pytest

from ckpt_tool.core.spares_model import MAX_EXPECTED_FAILURES, compare_spares, expected_failures, model_spares


def simulate(nodes, spares, mtbf, hours, min_nodes, wait, restart_s, runs=4000, seed=7):
    """The job played out failure by failure (Monte Carlo): mean wall hours, failures, replacements, shrinks, requeues."""
    rnd = random.Random(seed)
    sums = [0.0] * 5
    for _ in range(runs):
        work = wall = 0.0
        active, left = nodes, spares
        counts = [0, 0, 0, 0]
        while True:
            dt = rnd.expovariate(active / mtbf)
            if work + dt * active / nodes >= hours:
                wall += (hours - work) * nodes / active
                break
            work += dt * active / nodes
            wall += dt + restart_s / 3600
            counts[0] += 1
            if left:
                left -= 1
                counts[1] += 1
            elif active - 1 >= min_nodes:
                active -= 1
                counts[2] += 1
            else:
                counts[3] += 1
                wall += wait
                active, left = nodes, spares
        for i, v in enumerate((wall, *counts)):
            sums[i] += v
    return [s / runs for s in sums]


def test_without_failures_goodput_is_one_and_the_spares_cost_their_share_of_the_nodes():
    s = model_spares(8, 2, node_mtbf_hours=1e12, job_hours=100)
    assert s.goodput == pytest.approx(1.0, abs=1e-6) and s.wall_hours == pytest.approx(100, abs=1e-4)
    assert s.node_hour_efficiency == pytest.approx(8 / 10, abs=1e-6)
    assert s.failures == pytest.approx(8e-10) and s.mean_nodes_active == pytest.approx(8)


def test_expected_failures_are_nodes_times_hours_over_the_mtbf_whatever_happens_to_them():
    for spares, min_nodes in ((0, 8), (0, 5), (2, 8), (3, 4)):
        s = model_spares(8, spares, node_mtbf_hours=400, job_hours=200, min_nodes=min_nodes)
        assert s.failures == pytest.approx(8 * 200 / 400) == expected_failures(8, 400, 200)
        assert s.replacements + s.shrinks + s.requeues == pytest.approx(s.failures)
    rare = model_spares(64, 1, node_mtbf_hours=1e6, job_hours=10)
    assert rare.failures == pytest.approx(64 * 10 / 1e6, rel=1e-9)


def test_with_min_nodes_equal_to_nodes_and_no_spares_every_failure_requeues():
    s = model_spares(16, 0, node_mtbf_hours=200, job_hours=100, requeue_wait_hours=2, restart_seconds=360)
    assert s.requeues == pytest.approx(s.failures) == pytest.approx(8.0)
    assert s.shrinks == 0 and s.replacements == 0 and s.mean_nodes_active == pytest.approx(16)
    assert s.wall_hours == pytest.approx(100 + 8 * (2 + 0.1))  # each: the restart and the queue wait


def test_the_first_k_failures_take_a_standby_then_it_shrinks_then_it_requeues():
    # one failure per job (almost surely) or none: the first is a replacement whenever a spare is held
    s = model_spares(8, 1, node_mtbf_hours=8e6, job_hours=1, min_nodes=6)
    assert s.replacements == pytest.approx(s.failures, rel=1e-6) and s.shrinks < s.failures * 1e-5
    without = model_spares(8, 0, node_mtbf_hours=8e6, job_hours=1, min_nodes=6)
    assert without.shrinks == pytest.approx(without.failures, rel=1e-6) and without.requeues < without.failures * 1e-5


def test_the_model_agrees_with_a_simulation_of_the_job():
    for args in ((8, 1, 2000, 168, 6, 1.0, 300), (8, 2, 50, 100, 6, 2.0, 600), (16, 0, 100, 200, 10, 3.0, 100)):
        nodes, spares, mtbf, hours, min_nodes, wait, restart = args
        m = model_spares(nodes, spares, mtbf, hours, min_nodes, wait, restart)
        wall, failures, replacements, shrinks, requeues = simulate(*args)
        assert m.wall_hours == pytest.approx(wall, rel=0.01)
        assert m.failures == pytest.approx(failures, rel=0.05, abs=0.02)
        assert m.replacements == pytest.approx(replacements, rel=0.05, abs=0.02)
        assert m.shrinks == pytest.approx(shrinks, rel=0.05, abs=0.02)
        assert m.requeues == pytest.approx(requeues, rel=0.1, abs=0.02)


def test_spares_strictly_help_the_wall_time_when_failures_are_frequent_and_requeues_costly():
    c = compare_spares(32, 2, node_mtbf_hours=500, job_hours=300, requeue_wait_hours=6)
    assert c.with_spares.wall_hours < c.without.wall_hours - 10
    assert c.better_by_wall == "spares" and c.wall_hours_saved == pytest.approx(c.without.wall_hours - c.with_spares.wall_hours)
    assert c.with_spares.requeues < c.without.requeues
    assert c.better_by_node_hours == "spares" and c.node_hours_extra < 0  # the queue waits cost more than 2 idle nodes
    assert c.without.spares == 0 and c.with_spares.spares == 2


def test_many_spares_cost_node_hours_when_failures_are_rare():
    c = compare_spares(8, 8, node_mtbf_hours=1e5, job_hours=100)
    assert c.better_by_node_hours == "no spares" and c.node_hours_extra == pytest.approx(1.0, abs=0.01)
    assert c.with_spares.node_hour_efficiency < c.without.node_hour_efficiency
    assert c.with_spares.node_hour_efficiency == pytest.approx(0.5, abs=0.01)


def test_shrinking_slows_the_training_and_spares_keep_it_at_full_size():
    c = compare_spares(8, 1, node_mtbf_hours=2000, job_hours=168, min_nodes=6)
    assert c.without.shrinks > c.with_spares.shrinks > 0
    assert c.without.mean_nodes_active < c.with_spares.mean_nodes_active < 8
    assert c.without.training_hours > c.with_spares.training_hours > 168
    assert c.better_by_wall == "spares" and c.better_by_node_hours == "no spares"  # 1 idle node in 9 costs more than it saves


def test_wall_time_falls_and_goodput_rises_as_the_nodes_get_more_reliable():
    for spares, min_nodes in ((0, 8), (0, 4), (2, 8), (1, 6)):
        walls = [model_spares(8, spares, mtbf, 500, min_nodes, 2.0, 600).wall_hours for mtbf in (20, 50, 200, 1000, 5000, 1e5)]
        assert walls == sorted(walls, reverse=True) and len(set(walls)) == len(walls)
        assert walls[-1] == pytest.approx(500, rel=0.01)


def test_more_spares_never_cost_wall_time():
    walls = [model_spares(16, k, 300, 400, 12, 4.0, 300).wall_hours for k in range(6)]
    assert walls == sorted(walls, reverse=True)


def test_zero_spares_ties_with_the_plan_without_them():
    c = compare_spares(8, 0, 100, 50, 6)
    assert c.with_spares == c.without and c.better_by_wall == "tie" and c.better_by_node_hours == "tie"
    assert c.wall_hours_saved == 0 and c.node_hours_extra == pytest.approx(0)


def test_the_model_is_fast_for_large_jobs_and_refuses_inputs_outside_it():
    start = time.perf_counter()
    big = compare_spares(1024, 8, node_mtbf_hours=1000, job_hours=2000, min_nodes=1000)
    assert time.perf_counter() - start < 0.5  # ~2000 failures per job: about a millisecond
    assert big.with_spares.failures == pytest.approx(2048) and big.with_spares.requeues > 0
    for bad in (
        {"nodes": 0, "spares": 0},
        {"nodes": 8, "spares": -1},
        {"nodes": 8, "spares": 0, "min_nodes": 9},
        {"nodes": 8, "spares": 0, "min_nodes": 0},
        {"nodes": 8, "spares": 0, "node_mtbf_hours": -1.0},
        {"nodes": 8, "spares": 0, "job_hours": float("nan")},
        {"nodes": 8, "spares": 0, "requeue_wait_hours": -1.0},
        {"nodes": 8, "spares": 0, "node_mtbf_hours": 8 * 100 / (MAX_EXPECTED_FAILURES * 2)},
    ):
        args = {"node_mtbf_hours": 100.0, "job_hours": 100.0, **bad}
        with pytest.raises(ValueError):
            model_spares(**args)
