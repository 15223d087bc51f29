"""The recovery time model of figure 13 (bench/recovery_time.py): what grows with the job and what does not."""

from __future__ import annotations

import pytest

from .bench_scripts import bench_module

_model = bench_module("recovery_time")
CHECK, GB, Job, Measured = _model.CHECK, _model.GB, _model.Job, _model.Measured
check_seconds, dominant, load_seconds, phases = _model.check_seconds, _model.dominant, _model.load_seconds, _model.phases


def test_the_load_is_spread_over_the_nodes_until_the_filesystem_is_the_limit():
    one = Job(8, 200 * GB, node_read_bps=2 * GB, fs_aggregate_bps=200 * GB)  # 1 node
    many = Job(512, 200 * GB, node_read_bps=2 * GB, fs_aggregate_bps=200 * GB)  # 64 nodes at 2 GB/s each
    huge = Job(4096, 200 * GB, node_read_bps=2 * GB, fs_aggregate_bps=200 * GB)  # 512 nodes share 200 GB/s
    assert load_seconds(one) == pytest.approx(100.0)
    assert load_seconds(many) == pytest.approx(200 / 64 / 2)
    assert load_seconds(huge) == pytest.approx(1.0)  # the aggregate bounds it, not the nodes


def test_the_start_check_hashes_everything_on_one_node_or_stats_each_file():
    small, big = Job(8, 200 * GB), Job(4096, 200 * GB)
    assert check_seconds(small, hash_on_one_node=True) == check_seconds(big, hash_on_one_node=True) == pytest.approx(100.0)
    assert check_seconds(big, hash_on_one_node=False) == pytest.approx((4096 * 5 + 2) * 0.0005 / 16)  # 16 stats at once
    assert check_seconds(small, hash_on_one_node=False) < 0.1


def test_phases_per_path_and_the_dominant_one():
    m = Measured()
    job = Job(512, 200 * GB)
    crash, hang, requeue = (phases(job, m, p) for p in ("crash", "hang", "requeue"))
    assert crash["detection"] == m.detect_crash_s and hang["detection"] == m.detect_hang_s
    assert CHECK in requeue and "detection" not in requeue
    assert sum(hang.values()) - sum(crash.values()) == pytest.approx(m.detect_hang_s - m.detect_crash_s)
    assert dominant(crash) == "load (hash-checked as read)"  # the restart itself is pre-warmed
    assert requeue["new ranks: start, init, model"] == m.cold_start_s and crash["new ranks: start, init, model"] == m.restart_s
    before = phases(job, m, "requeue", hash_on_one_node=True)
    assert dominant(before) == CHECK and before[CHECK] > 100
    with pytest.raises(ValueError, match="unknown path"):
        phases(job, m, "reboot")
