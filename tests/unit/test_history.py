"""core.history: the loss by step and the marks of a run's timeline. Pure."""

from __future__ import annotations

from ckpt_tool.core.history import story


def ev(event: str, time: float, **kw) -> dict:
    return {"event": event, "time": time, **kw}


TIMELINE = [
    ev("commit", 1.0, step=5, probe_loss=5.5),
    ev("commit", 2.0, step=10, probe_loss=5.1),
    ev("rank_exited", 3.0, step=12, rank=1, cause="killed", round="r", attempt=0, node="a"),
    ev("rank_exited", 3.1, step=12, rank=0, cause="peer_failure", round="r", attempt=0, node="a"),  # a victim: no mark
    ev("rank_exited", 3.2, step=12, rank=3, cause="crashed", round="r", attempt=0, node="a"),  # same failure, same node
    ev("restarted", 4.0),  # not a mark
    ev("commit", 5.0, step=15, probe_loss=4.9),
    ev("requeue", 6.0, job_id="7"),  # no step: at the newest checkpoint before it
    ev("rollback", 7.0, step=10, previous=15),
    ev("nodes_left_behind", 8.0, drop=["n3"], reason="x"),
    ev("commit", 9.0, step=10, probe_loss=5.0),  # step 10 again after the rollback: the newest value wins
]


def test_the_story_of_a_timeline_from_the_probe_losses():
    s = story(TIMELINE)
    assert s.loss_source == "probe loss at each checkpoint" and s.loss == ((5, 5.5), (10, 5.0), (15, 4.9))
    marks = [(m.step, m.kind, m.label) for m in s.marks if m.kind != "checkpoint"]
    assert marks == [
        (12, "failure", "rank 1 failed"),
        (15, "requeue", "requeued"),
        (10, "rollback", "rolled back to 10"),
        (15, "shrink", "left n3 behind"),
    ]
    assert [m.step for m in s.marks if m.kind == "checkpoint"] == [5, 10, 15, 10]


def test_metrics_give_the_curve_and_garbage_events_are_ignored():
    s = story([*TIMELINE, {"event": "hang"}, ev("hang", "noon"), ev("straggler", 9.5, rank=2)], metrics=[(2, 1.0), (1, 2.0)])
    assert s.loss_source == "metrics" and s.loss == ((1, 2.0), (2, 1.0))
    assert s.marks[-1].kind == "straggler" and s.marks[-1].step == 10 and s.marks[-1].label == "straggler: rank 2"
    assert story([]).loss == () and story([]).marks == ()


def test_a_replace_is_marked_as_a_replace_not_a_shrink():
    """`ckpt nodes` logs nodes_left_behind (action replace) and one `replaced` per slot: the picture
    marks the replacement, since the job kept its size."""
    timeline = [
        ev("commit", 1.0, step=5, probe_loss=5.5),
        ev("nodes_left_behind", 2.0, action="replace", drop=["n2"], keep=["n1", "n3"], reason="x", checkpoint=5),
        ev("replaced", 2.0, node="n2", by="n3", reason="2 failures in a row"),
        ev("nodes_left_behind", 3.0, action="shrink", drop=["n3"], keep=["n1"], reason="x", checkpoint=5),
    ]
    assert [(m.step, m.kind, m.label) for m in story(timeline).marks if m.kind != "checkpoint"] == [
        (5, "replace", "replaced n2 with n3"),
        (5, "shrink", "left n3 behind"),
    ]
