"""Wrong numbers, decided on plain data (core.anomaly): what counts as one, what a replay from a
checkpoint says about it, what a finding leads to, and which replica disagrees."""

from __future__ import annotations

import math

import pytest

from ckpt_tool.core.anomaly import (
    FINGERPRINT,
    Anomaly,
    AnomalyPolicy,
    Difference,
    RankReplay,
    compare_replicas,
    detect,
    first_difference,
    judge_replay,
    plan_anomaly,
    same_bits,
)

NAN, INF = float("nan"), float("inf")


def test_a_nan_or_an_infinity_is_found_at_once_before_any_window():
    policy = AnomalyPolicy(window=5)
    nan = detect(1, 7, {"loss": 2.0, "grad_norm": NAN}, {}, policy)
    assert (nan.rank, nan.step, nan.field, nan.kind, math.isnan(nan.value)) == (1, 7, "grad_norm", "nan", True)
    assert nan.describe() == "rank 1: grad_norm is NaN at step 7"
    found = detect(0, 3, {"loss": -INF}, {}, policy)
    assert (found.kind, found.field, found.rank, found.step) == ("inf", "loss", 0, 3)
    assert "loss is infinite at step 3" in found.describe()


def test_a_spike_is_judged_only_once_the_window_is_full_and_only_upward():
    policy = AnomalyPolicy(window=5, k=10.0, min_rel_spread=0.05)
    history = {"loss": [2.0, 2.1, 1.9, 2.05, 1.95]}
    assert detect(0, 6, {"loss": 9.0}, {"loss": history["loss"][:4]}, policy) is None  # 4 values: not judged yet
    limit = policy.threshold(history["loss"])
    assert limit is not None and 2.5 < limit < 4.0  # median 2.0 + 10 x max(1.4826 x MAD 0.05, 5% of 2.0)
    spike = detect(0, 6, {"loss": 9.0}, history, policy)
    assert spike is not None and spike.kind == "spike" and spike.threshold == limit
    assert "spiked to 9 at step 6 (threshold" in spike.describe()
    assert detect(0, 6, {"loss": 0.01}, history, policy) is None  # a loss that falls is training
    # a constant series: its noise is not a spike (the floor of the spread)
    assert detect(0, 6, {"loss": 2.0000001}, {"loss": [2.0] * 5}, policy) is None


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"mode": "halt"}, "one of replay, stop, warn"),
        ({"window": 2}, "window must be an integer >= 3"),
        ({"k": 0}, "k"),
        ({"min_rel_spread": -1}, "min_rel_spread"),
    ],
)
def test_a_bad_policy_says_what_is_wrong(kw, words):
    with pytest.raises(ValueError, match=words):
        AnomalyPolicy(**kw)


def test_any_nan_is_the_same_nan_and_zero_keeps_its_sign():
    """The record is JSON: a NaN's sign and payload do not survive it, so a NaN computed again is a reproduction."""
    assert same_bits(NAN, -NAN) and same_bits(1.5, 1.5)
    assert not same_bits(0.0, -0.0) and not same_bits(1.0, math.nextafter(1.0, 2.0)) and not same_bits(NAN, 1.0)


def test_the_first_difference_is_the_first_replayed_step_whose_bits_differ():
    recorded = {11: {"loss": 2.0, "grad_norm": 0.5}, 12: {"loss": 2.1, "grad_norm": NAN}, 13: {"loss": 2.2, "grad_norm": 0.4}}
    assert first_difference(recorded, {11: {"loss": 2.0, "grad_norm": 0.5}}) is None
    d = first_difference(recorded, {11: {"loss": 2.0, "grad_norm": 0.5}, 12: {"loss": 2.1, "grad_norm": 0.3}})
    assert d.step == 12 and list(d.fields) == ["grad_norm"] and d.fields["grad_norm"][1] == 0.3
    assert d.describe() == "grad_norm nan -> 0.3"
    assert first_difference(recorded, {12: {"loss": 2.1}}).fields.keys() == {"grad_norm"}  # a field gone counts
    assert first_difference({}, {12: {"loss": 1.0}}) is None  # nothing recorded to compare with


def _replay(rank, step=None, fields=None, recorded=None):
    return RankReplay(rank, Difference(step, fields) if step is not None else None, recorded or {})


def test_a_replay_that_differs_on_one_ranks_own_value_names_that_rank():
    found = [Anomaly(1, 12, "grad_norm", NAN, "nan")]
    recorded = {12: {"loss": 2.0, "grad_norm": NAN}}
    verdict = judge_replay(
        found, [_replay(0, recorded={12: {"loss": 2.0, "grad_norm": 0.3}}), _replay(1, 12, {"grad_norm": (NAN, 0.29)}, recorded)]
    )
    assert (verdict.kind, verdict.ranks, verdict.step, verdict.differs_at, verdict.action) == ("transient", (1,), 12, 12, "continue")
    assert "transient fault: the replay differs from the first run at step 12: rank 1 (grad_norm nan -> 0.29)" in verdict.message()
    assert "hardware fault, not the data; training goes on from the replay" in verdict.message()


def test_a_value_every_rank_shares_names_nobody_but_the_ranks_own_value_does():
    """An all-reduced value changes on every rank: it cannot say whose fault it was."""
    shared = {12: {"global_loss": 5.0, "loss": 2.0}}
    both = [_replay(r, 12, {"global_loss": (5.0, 4.0)}, shared) for r in (0, 1)]
    verdict = judge_replay([Anomaly(0, 12, "global_loss", NAN, "nan")], both)
    assert verdict.kind == "transient" and verdict.ranks == ()
    assert "no single rank (only values every rank shares changed)" in verdict.message()
    own = [_replay(0, 12, {"global_loss": (5.0, 4.0)}, {12: {"global_loss": 5.0, "loss": 2.0}}),
           _replay(1, 12, {"global_loss": (5.0, 4.0), "loss": (2.5, 2.0)}, {12: {"global_loss": 5.0, "loss": 2.5}})]  # fmt: skip
    assert judge_replay([], own).ranks == (1,)
    # the first differing step wins: a rank that only differs later is a victim of the first
    later = [_replay(0, 13, {"loss": (1.0, 1.1)}, {13: {"loss": 1.0}}), _replay(1, 12, {"loss": (2.5, 2.0)}, {12: {"loss": 2.5}})]
    skew = judge_replay([Anomaly(1, 15, "w", 3.0, "replica", 4.0)], later)
    assert (skew.ranks, skew.differs_at, skew.step) == ((1,), 12, 15)  # it differed before it was found


def test_a_replay_that_reproduces_a_nan_stops_and_a_spike_goes_on():
    nan = [Anomaly(0, 12, "loss", NAN, "nan")]
    verdict = judge_replay(nan, [_replay(0), _replay(1)])
    assert (verdict.kind, verdict.action, verdict.ranks) == ("reproducible", "stop", ())
    assert "the data or the model, not the hardware; stopped" in verdict.message()
    spike = judge_replay([Anomaly(0, 12, "loss", 9.0, "spike", 3.0)], [_replay(0), _replay(1)])
    assert (spike.kind, spike.action) == ("reproducible", "continue") and "training goes on" in spike.message()
    assert spike.to_json()["verdict"] == "reproducible" and spike.to_json()["anomalies"][0]["threshold"] == 3.0
    assert judge_replay(nan, []).to_json()["anomalies"][0]["value"] == "nan"  # JSON has no NaN: a string


def test_what_a_finding_leads_to():
    found = [Anomaly(1, 12, "loss", NAN, "nan")]
    assert plan_anomaly("warn", found, supervised=True, checkpoint=10, replayed_from=None).action == "warn"
    assert plan_anomaly("stop", found, supervised=True, checkpoint=10, replayed_from=None).action == "stop"
    replay = plan_anomaly("replay", found, supervised=True, checkpoint=10, replayed_from=None)
    assert (replay.action, replay.from_step) == ("replay", 10) and "replaying from checkpoint 10" in replay.why
    alone = plan_anomaly("replay", found, supervised=False, checkpoint=10, replayed_from=None)
    assert alone.action == "stop" and "a replay needs ckpt run" in alone.why
    fresh = plan_anomaly("replay", found, supervised=True, checkpoint=None, replayed_from=None)
    assert fresh.action == "stop" and "no checkpoint yet to replay from" in fresh.why
    again = plan_anomaly("replay", found, supervised=True, checkpoint=10, replayed_from=10)
    assert again.action == "stop" and "a second anomaly after a replay from checkpoint 10" in again.why
    assert plan_anomaly("replay", found, supervised=True, checkpoint=15, replayed_from=10).action == "replay"  # a new interval


def test_the_replica_that_differs_from_the_majority_is_named():
    names = ["w", "b"]
    keys = [[(), ()]] * 3
    prints = [[7, 1], [7, 1], [8, 1]]
    [found] = compare_replicas(20, names, keys, prints)
    assert (found.rank, found.field, found.kind, found.value, found.threshold) == (2, "w", "replica", 8.0, 7.0)
    assert "rank 2: its replica of w differs from the other ranks' copies after step 20" == found.describe()
    assert compare_replicas(20, names, keys, [[7, 1]] * 3) == []


def test_two_replicas_that_differ_name_both_and_groups_are_compared_apart():
    """With two copies nothing says which is right (the replay does); ranks of another key
    (another shard) are never compared with these."""
    keys = [[(0,)], [(0,)], [(1,)], [(1,)]]  # e.g. HSDP: ranks 0,1 hold shard 0, ranks 2,3 shard 1
    prints = [[5], [6], [9], [9]]
    assert [a.rank for a in compare_replicas(3, ["w"], keys, prints)] == [0, 1]
    assert compare_replicas(3, ["w"], keys, [[5], [5], [9], [9]]) == []
    # a rank named once, at its first differing parameter
    assert [(a.rank, a.field) for a in compare_replicas(3, ["a", "b"], [[(), ()]] * 3, [[1, 2], [1, 2], [0, 0]])] == [(2, "a")]


def test_a_fingerprint_is_compared_by_a_replay_but_never_judged_as_a_number():
    """A digest of a rank's replicas: random-looking, never a spike; a replay that changes it names the rank."""
    policy = AnomalyPolicy(window=3)
    fp = f"{FINGERPRINT}replicas"
    assert detect(0, 9, {fp: 4.5e15, "loss": 2.0}, {fp: [1.0, 2.0, 3.0], "loss": [2.0, 2.0, 2.0]}, policy) is None
    skewed = [_replay(0, None, None, {8: {fp: 7.0}}), _replay(1, 8, {fp: (9.0, 7.0)}, {8: {fp: 9.0}})]
    verdict = judge_replay([Anomaly(0, 8, "w", 7.0, "replica", 9.0), Anomaly(1, 8, "w", 9.0, "replica", 7.0)], skewed)
    assert (verdict.kind, verdict.ranks) == ("transient", (1,))


def test_replicas_that_part_again_in_the_replay_stop_the_run():
    """A code path that updates the replicas differently: any checkpoint of it would mean one thing or another."""
    verdict = judge_replay([Anomaly(1, 8, "w", 9.0, "replica", 7.0)], [_replay(0), _replay(1)])
    assert (verdict.kind, verdict.action) == ("reproducible", "stop")


def test_an_audit_is_a_replay_asked_for_and_its_own_verdict():
    audit = [Anomaly(0, 20, "audit", 0.0, "audit")]
    assert audit[0].describe() == "audit of the steps up to 20"
    plan = plan_anomaly("warn", audit, supervised=True, checkpoint=15, replayed_from=None)  # the mode is about wrong values
    assert (plan.action, plan.from_step) == ("replay", 15) and "recomputing them from checkpoint 15" in plan.why
    for kw, why in (
        ({"supervised": False, "checkpoint": 15, "replayed_from": None}, "needs ckpt run"),
        ({"supervised": True, "checkpoint": None, "replayed_from": None}, "no checkpoint yet"),
        ({"supervised": True, "checkpoint": 15, "replayed_from": 15}, "this interval was replayed already"),
    ):
        skipped = plan_anomaly("replay", audit, **kw)
        assert skipped.action == "warn" and why in skipped.why, skipped
    passed = judge_replay(audit, [_replay(0), _replay(1)])
    assert (passed.kind, passed.action, passed.ranks) == ("audited", "continue", ())
    assert passed.message() == "audit passed: the steps up to 20 recomputed from the checkpoint, the same bits on every rank"
    fp = f"{FINGERPRINT}grads"
    caught = judge_replay(audit, [_replay(0, None, None, {17: {fp: 1.0}}), _replay(1, 17, {fp: (3.0, 2.0)}, {17: {fp: 3.0}})])
    assert (caught.kind, caught.ranks, caught.differs_at) == ("transient", (1,), 17)
