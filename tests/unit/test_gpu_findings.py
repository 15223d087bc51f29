"""GPU readings (core.gpu_findings) and the watchdog's rank health view with the fake NVML reader
(supervise.gpu_monitor.FakeReader: the same file format a test or a demo writes)."""

from __future__ import annotations

import json

from ckpt_tool.core.gpu_findings import GpuPolicy, GpuSample, GpuWatch
from ckpt_tool.core.stragglers import StepTiming, StragglerPolicy
from ckpt_tool.supervise.gpu_monitor import FakeReader, device_of_local_rank, open_reader
from ckpt_tool.supervise.rank_vitals import RankHealth, read_rank_health


def readings(*utils: float, **errors) -> dict[int, GpuSample]:
    return {
        r: GpuSample(r, u, ecc_uncorrected=errors.get(f"ecc{r}", 0), xids=tuple(errors.get(f"xid{r}", ()))) for r, u in enumerate(utils)
    }


def test_a_gpu_idle_while_its_peers_are_busy_is_a_hang_candidate_once_per_episode():
    watch = GpuWatch(GpuPolicy(idle_samples=3))
    found = [watch.observe(readings(0, 100, 98, 99)) for _ in range(5)]
    assert [len(f) for f in found] == [0, 0, 1, 0, 0]
    name, data = found[2][0]
    assert name == "gpu_idle" and data["rank"] == 0 and data["peers_util"] == 99
    assert watch.observe(readings(90, 100, 98, 99)) == []  # working again
    assert [watch.observe(readings(0, 100, 98, 99)) for _ in range(3)][-1][0][0] == "gpu_idle"  # a new episode


def test_every_gpu_idle_or_a_lone_gpu_is_not_a_hang_candidate():
    watch = GpuWatch(GpuPolicy(idle_samples=1))
    assert watch.observe(readings(0, 0, 0, 0)) == []  # a data stall, a checkpoint: everybody waits
    assert watch.observe(readings(0)) == []  # one GPU on the node: nobody to compare with
    assert watch.observe(readings(0, 30, 20, 40)) == []  # the others are not busy either


def test_a_critical_xid_or_a_new_uncorrectable_ecc_error_is_reported_once():
    watch = GpuWatch()
    assert watch.observe(readings(97, 98)) == []
    [(name, data)] = watch.observe(readings(97, 98, xid1=[79]))
    assert name == "gpu_error" and data["rank"] == 1 and data["xids"] == [79]
    [(name, data)] = watch.observe(readings(97, 98, ecc0=2))
    assert name == "gpu_error" and data["rank"] == 0 and data["ecc_uncorrected_new"] == 2
    assert watch.observe(readings(97, 98, ecc0=2)) == []  # the same count: already told


def test_the_device_of_a_local_rank_follows_cuda_visible_devices():
    assert device_of_local_rank(1, None) == "1"
    assert device_of_local_rank(1, "4,5") == "5"
    assert device_of_local_rank(0, "GPU-8f2a,GPU-11aa") == "GPU-8f2a"
    assert device_of_local_rank(3, "4,5") == "3"  # fewer visible than ranks: the convention's index


def test_without_nvml_the_reason_is_said(monkeypatch):
    monkeypatch.delenv("CKPT_FAKE_NVML", raising=False)
    reader, why = open_reader({})
    assert reader is None and ("nvidia-ml-py" in why or "NVML" in why)


def test_the_rank_health_view_reads_the_fake_gpus_scores_ranks_and_writes_its_file(tmp_path):
    gpus = tmp_path / "nvml.json"
    gpus.write_text(json.dumps({"gpus": [{"index": 0, "util": 0}, {"index": 1, "util": 100}, {"index": 2, "util": 97}]}))
    view = RankHealth(tmp_path, "n1", StragglerPolicy(warmup=0, window=1, consecutive=1, window_s=0), FakeReader(gpus), "0,1,2")
    found = []
    for t in range(4):
        found += view.poll(float(t), {10: 0, 11: 1, 12: 2})
    assert [(n, d["rank"]) for n, d in found] == [("gpu_idle", 10)]
    assert view.on_timing(11, {"garbage": 1}) == []
    [(name, data)] = view.on_timing(11, StepTiming(5, 1.0, 0.9, 0.0, {}, {"compute": 0.3}).to_wire())
    assert name == "straggler" and data["rank"] == 11 and data["slower_x"] == 3.0
    gpus.write_text("{not json")  # a reading that fails is no reading, not a crash
    assert view.poll(10.0, {10: 0}) == []
    view.close()
    [row] = read_rank_health(tmp_path)
    assert row["node"] == "n1" and row["rank"] == 11 and row["straggler"] and row["score"] == 0.333


def test_status_skips_rank_health_files_that_a_watchdog_did_not_write(tmp_path):
    (tmp_path / "rank_health.evil.json").write_text(json.dumps({"node": "x", "time": "yesterday", "ranks": [{"rank": 1}]}))
    (tmp_path / "rank_health.bad.json").write_text("garbage")
    row = {"rank": 3, "step": 9, "wall_s": 0.1, "compute_s": 0.05, "wait_s": 0.02, "score": 1.0, "individual": 1.0, "straggler": False}
    mixed = [1, {"rank": "zero"}, {**row, "score": "high"}, row]
    (tmp_path / "rank_health.n2.json").write_text(json.dumps({"node": "n2", "time": 5.0, "ranks": mixed}))
    assert read_rank_health(tmp_path) == [{**row, "node": "n2", "as_of": 5.0}]
