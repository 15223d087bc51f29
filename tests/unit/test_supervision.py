import pytest

from ckpt_tool.core.supervision import Beat, CrashLoopBreaker, find_hangs
from ckpt_tool.core.timeouts import DurationLog, TimeoutPolicy, calibrate

TIMEOUTS = {"init": 600.0, "step": 5.0, "data": 60.0, "checkpoint": 600.0, "eval": 600.0}


def beat(rank, phase, t, step=10):
    return Beat(rank, 100 + rank, step, phase, t)


def test_ranks_silent_in_step_are_a_hang_culprit_first():
    hangs = find_hangs([beat(0, "step", 100.0), beat(1, "step", 99.0)], TIMEOUTS, now=106.0)
    assert [h.rank for h in hangs] == [1, 0]
    assert hangs[0].silent_s == 7.0 and hangs[0].timeout_s == 5.0
    assert find_hangs([beat(0, "step", 100.0), beat(1, "step", 99.0)], TIMEOUTS, now=104.9) == []
    assert "rank 1 silent for 7.0 s in phase 'step'" in hangs[0].reason()


def test_a_data_stall_excuses_the_peers_waiting_for_it():
    # rank 0 stalls in its data loader; rank 1 finished its data, entered step, waits for rank 0,
    # whether its beat came after rank 0's or (a faster rank) before it
    for rank1_beat in (100.2, 99.9):
        beats = [beat(0, "data", 100.0), beat(1, "step", rank1_beat)]
        assert find_hangs(beats, TIMEOUTS, now=130.0) == []  # a 30 s data stall is not a hang
        assert [h.rank for h in find_hangs(beats, TIMEOUTS, now=161.0)] == [0, 1]
    # the stall ends: rank 0 beats; rank 1, silent since 100.2, is about to go on
    back = [beat(0, "step", 120.0), beat(1, "step", 100.2)]
    assert find_hangs(back, TIMEOUTS, now=121.0) == []
    assert [h.rank for h in find_hangs(back, TIMEOUTS, now=125.5)] == [1, 0]


def test_a_frozen_rank_is_caught_although_its_peer_waits_inside_a_checkpoint():
    # rank 0 frozen (SIGSTOP) in step 14; rank 1 went on to the save of step 15 and waits there
    beats = [beat(0, "step", 100.0, step=14), beat(1, "checkpoint", 100.3, step=15)]
    hangs = find_hangs(beats, TIMEOUTS, now=105.5)
    assert [h.rank for h in hangs] == [0, 1] and hangs[0].phase == "step"


def test_no_hang_within_timeout():
    assert find_hangs([beat(0, "step", 100.0)], TIMEOUTS, now=104.9) == []
    assert find_hangs([], TIMEOUTS, now=1e9) == []


def test_calibration_uses_max_after_warmup_times_factor_with_floor_and_override():
    observed = {"step": [9.0, 8.0, 7.0, 2.0, 3.0], "checkpoint": [100.0] * 5, "data": [0.01] * 10}
    t = calibrate(observed, TimeoutPolicy(factor=4.0, warmup=3, overrides={"eval": 42.0}))
    assert t["step"] == 12.0  # 4 x 3.0: the slow first steps are ignored
    assert t["checkpoint"] == 400.0  # observed: 4 x 100 (the 600 s floor applies only before any observation)
    assert calibrate({"checkpoint": [0.1] * 5}, TimeoutPolicy())["checkpoint"] == 60.0  # calibrated floor
    assert calibrate({}, TimeoutPolicy())["checkpoint"] == 600.0
    assert t["data"] == 60.0  # floor: fast data never makes a stall an alarm
    assert t["eval"] == 42.0 and t["init"] == 600.0


@pytest.mark.parametrize("kw", [{"factor": 0.5}, {"overrides": {"nap": 3.0}}, {"overrides": {"step": 0}}])
def test_policy_refuses_bad_values(kw):
    with pytest.raises(ValueError):
        TimeoutPolicy(**kw)


def test_duration_log_is_bounded_and_round_trips_untrusted_json():
    log = DurationLog(keep=3)
    for i in range(5):
        log.add("step", float(i))
    assert log.durations["step"] == [2.0, 3.0, 4.0]
    back = DurationLog.from_json({"step": [1.0, "x", -2, 3], "bogus": [1.0]})
    assert back.durations == {"step": [1.0, 3.0]}
    assert DurationLog.from_json("garbage").durations == {}


def test_crash_loop_breaker_needs_failures_in_a_row_without_progress():
    b = CrashLoopBreaker(limit=3)
    assert not b.on_failure(10)
    assert not b.on_failure(10)
    assert not b.on_failure(20)  # progress: a new checkpoint was committed in between
    assert not b.on_failure(20)
    assert b.on_failure(20)
    assert "3 failures in a row without a new checkpoint (past checkpoint step 20)" in b.message()


def test_crash_loop_before_any_checkpoint():
    b = CrashLoopBreaker(limit=2)
    assert not b.on_failure(None)
    assert b.on_failure(None)
    assert "before any checkpoint was loaded or saved" in b.message()
    # the ranks died before saying which checkpoint they resumed from: never claim there is none
    assert "past checkpoint step 30" in b.message(on_disk=30) and "no checkpoint" not in b.message(on_disk=30)
