"""One rank's watch over its values (training.anomaly_watch) on a real run directory: nothing is
written for a run that gives no values; the record is read back across a restart (the spike
window refilled, a replay's reference loaded from anomaly.json's request); a directory that
cannot be written leaves the checks working."""

from __future__ import annotations

import json
import math

from ckpt_tool.core.anomaly import Anomaly, AnomalyPolicy
from ckpt_tool.supervise import run_dir as rd
from ckpt_tool.training.anomaly_watch import AnomalyWatch

from ..conftest import read_only_view


def test_a_run_that_gives_no_values_writes_nothing(tmp_path):
    watch = AnomalyWatch(tmp_path / "run", 0, AnomalyPolicy())
    watch.start(None)
    watch.close()
    assert not (tmp_path / "run").exists()


def test_the_record_refills_the_window_at_a_restart_and_a_spike_is_found_after_it(tmp_path):
    policy = AnomalyPolicy(window=3, k=10)
    first = AnomalyWatch(tmp_path, 1, policy)
    first.start(None)
    for step, loss in enumerate([2.0, 2.1, 1.9, 2.05], 1):
        assert first.observe(step, {"loss": loss}) is None
    first.close()
    lines = [json.loads(x) for x in rd.metrics_path(tmp_path, 1).read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4] and lines[0]["values"] == {"loss": 2.0}
    again = AnomalyWatch(tmp_path, 1, policy)
    again.start(4)  # resumed from step 4: steps 2..4 fill the window of 3
    spike = again.observe(5, {"loss": 50.0})
    assert spike is not None and (spike.kind, spike.step, spike.rank) == ("spike", 5, 1)
    nan = again.observe(6, {"loss": float("nan")})
    assert nan is not None and nan.kind == "nan"
    again.close()


def test_a_replay_compares_with_the_first_runs_record_and_then_judges_again(tmp_path):
    first = AnomalyWatch(tmp_path, 0, AnomalyPolicy())
    first.start(None)
    for step in range(1, 6):
        first.observe(step, {"grad_norm": float("nan") if step == 5 else 0.5})
    first.close()
    first.begin_replay(5, 3, [Anomaly(0, 5, "grad_norm", float("nan"), "nan")])
    assert rd.read_anomaly(tmp_path)["status"] == "replaying"
    replay = AnomalyWatch(tmp_path, 0, AnomalyPolicy())
    replay.start(3)
    assert replay.replay_step == 5 and replay.replaying(4) and not replay.replaying(5)
    assert replay.observe(4, {"grad_norm": 0.5}) is None and replay.observe(5, {"grad_norm": 0.4}) is None  # compared, not judged
    mine = replay.rank_replay()
    assert mine.difference is not None and mine.difference.step == 5 and math.isnan(mine.difference.fields["grad_norm"][0])
    replay.close()


def test_a_directory_that_cannot_be_written_leaves_the_checks_working(tmp_path, caplog):
    (tmp_path / "src").mkdir()
    with read_only_view(tmp_path / "src", tmp_path / "ro") as ro:  # a real read-only filesystem (root: a bind mount)
        watch = AnomalyWatch(ro / "run", 0, AnomalyPolicy())
        watch.start(None)
        assert watch.observe(1, {"loss": float("inf")}).kind == "inf"
        assert watch.observe(2, {"loss": 1.0}) is None
        watch.close()
    assert "no metrics record" in caplog.text and "Read-only" in caplog.text


def test_a_fingerprint_is_the_same_for_the_same_bits_and_sees_one_ulp():
    import torch

    from ckpt_tool.training.replicas import fingerprints

    t = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    moved, zero = t.clone(), torch.zeros(3)
    moved[500] = torch.nextafter(moved[500], torch.tensor(float("inf")))
    a, b, c = fingerprints([t, t.clone(), moved])
    assert a == b != c
    assert fingerprints([zero])[0] != fingerprints([-zero])[0]  # -0.0: other bits
    assert fingerprints([torch.zeros(0), t.to(torch.bfloat16)])[0] == 0 and len(fingerprints([])) == 0


def test_a_full_disk_turns_the_record_off_and_the_checks_go_on(tmp_path, small_tmpfs, caplog):
    """The record is buffered: ENOSPC comes when a buffer goes out, in the middle of a step's
    append; it must not escape into the training (a real 24 KB tmpfs, filled)."""
    disk = small_tmpfs(tmp_path / "disk", "24k")
    watch = AnomalyWatch(disk, 0, AnomalyPolicy(window=3))
    watch.start(None)
    for step in range(1, 2000):  # ~100 bytes a line: past 24 KB within the loop
        assert watch.observe(step, {"loss": 2.0 + (step % 3) * 0.01, "grad_norm": 0.5}) is None
    assert watch.record is None and "No space left on device" in caplog.text and "turned off" in caplog.text
    assert watch.observe(2000, {"loss": float("nan")}).kind == "nan"
    watch.close()
