"""Pure decisions behind ``ckpt list`` and retention: statuses, LATEST's state, what may be deleted."""

from __future__ import annotations

import pytest

from ckpt_tool.core.index import format_event, known_invalid, parse_index
from ckpt_tool.core.layout import DirectoryKind, classify_directory
from ckpt_tool.core.listing import build_rows, latest_problem, local_rows
from ckpt_tool.core.retention import RetentionPolicy, kept_candidates, steps_to_delete


def events(*lines: str):
    return parse_index(lines).events


def test_a_failed_check_makes_a_step_invalid_until_it_passes_or_is_committed_again():
    log = events(
        format_event("commit", 1, step=5),
        format_event("commit", 2, step=10),
        format_event("validated", 3, step=10, ok=False),
        format_event("validated", 4, step=5, ok=False),
        format_event("validated", 5, step=5, ok=True),
        format_event("commit", 6, step=20),
        format_event("verified", 7, step=20, ok=False),
    )
    assert known_invalid(log) == {10, 20}
    assert known_invalid([*log, *events(format_event("commit", 8, step=10))]) == {20}


def test_every_step_directory_gets_a_row_with_its_status():
    log = events(format_event("commit", 1, step=5, bytes=100), format_event("validated", 2, step=5, ok=True))
    rows = build_rows({5: True, 10: False}, partial=[15], deleting=[1], quarantined=[(3, "step_00000003.123")], events=log, latest=20)
    assert [(r.step, r.status, r.latest) for r in rows] == [
        (1, "deleting", False),
        (3, "quarantined", False),
        (5, "validated", False),
        (10, "damaged", False),
        (15, "partial", False),
        (20, "missing", True),
    ]
    assert rows[2].bytes == 100 and rows[2].last_validated == 2


@pytest.mark.parametrize(
    "latest, pointer_error, dirs, expected",
    [
        (10, None, {10: True}, None),
        (None, None, {}, None),  # a new directory: no LATEST yet, nothing wrong
        (None, None, {10: True}, "LATEST is missing although checkpoints exist"),
        (None, "LATEST is damaged: ...", {10: True}, "LATEST is damaged: ..."),
        (20, None, {10: True}, "LATEST names step 20, whose directory is missing"),
        (10, None, {10: False}, "LATEST names step 10, which has no manifest (damaged)"),
    ],
)
def test_latest_problem(latest, pointer_error, dirs, expected):
    assert latest_problem(latest, pointer_error, dirs, any(dirs.values())) == expected


def test_retention_counts_only_checkpoints_not_known_invalid():
    # LATEST (20) failed validation: keep-last 1 must not delete every valid older step
    assert steps_to_delete([5, 10, 15, 20], 20, RetentionPolicy(keep_last=1)) == [5, 10, 15]  # without the index
    assert steps_to_delete([5, 10, 15, 20], 20, RetentionPolicy(keep_last=1), invalid={20}) == [5, 10]
    # invalid steps are evidence: never deleted by retention, never counted
    assert steps_to_delete([5, 10, 15, 20], 20, RetentionPolicy(keep_last=2), invalid={10, 20}) == []
    assert steps_to_delete([5, 10, 15, 20, 25], 25, RetentionPolicy(keep_last=1), invalid={15}) == [5, 10, 20]


def test_kept_candidates_are_the_kept_trusted_steps_newest_first():
    assert kept_candidates([5, 10, 15, 20], victims=[5, 10], invalid={20}) == [15]
    assert kept_candidates([5, 10, 15, 20], victims=[5], invalid=set()) == [20, 15, 10]


def test_retention_policy_describes_itself_in_words():
    assert RetentionPolicy(3).describe() == "keep the last 3"
    assert RetentionPolicy(2, 1000).describe() == "keep the last 2 and every step divisible by 1000"


@pytest.mark.parametrize(
    "name, entries, kind",
    [
        ("ckpts", ["LATEST", "index.jsonl", "step_00000005"], DirectoryKind.CHECKPOINTS),
        ("ckpts", [".owner.json", ".lock"], DirectoryKind.CHECKPOINTS),  # claimed, nothing saved yet
        ("ckpts", [".step_00000005.partial"], DirectoryKind.CHECKPOINTS),
        ("ckpts", ["run"], DirectoryKind.CHECKPOINTS),  # `ckpt submit` made CKPT_DIR/run before the first save
        ("new", [], DirectoryKind.EMPTY),
        ("step_00000005", [".metadata", "__0_0.distcp", "ckpt_manifest.json"], DirectoryKind.ONE_CHECKPOINT),
        ("copy", ["ckpt_manifest.json", ".metadata"], DirectoryKind.ONE_CHECKPOINT),
        ("dcp", [".metadata", "__0_0.distcp", "__1_0.distcp"], DirectoryKind.PLAIN_DCP),
        ("home", ["notes.txt", "data"], DirectoryKind.OTHER),
    ],
)
def test_classify_directory(name, entries, kind):
    assert classify_directory(name, entries) is kind


def test_local_rows_are_the_fast_tiers_steps_newer_than_the_shared_tier():
    from ckpt_tool.core.index import IndexEvent

    def saved(step: int, t: float) -> IndexEvent:
        holders = {"n1:/dev/shm/x": [0, 1, 2], "n2:/dev/shm/x": [0, 1, 3]}
        return IndexEvent(
            "local_saved", t, {"step": step, "holders": holders, "keep": 2, "bytes": 10, "world_size": 4, "mesh": "dp_shard=4"}
        )

    events = [saved(12, 1.0), saved(14, 2.0), saved(16, 3.0)]
    rows = local_rows(events, shared_newest=10)
    assert [(r.step, r.status) for r in rows] == [(14, "local"), (16, "local")]  # the newest `keep`
    assert rows[-1].path == "node-local (n1:/dev/shm/x: ranks 0,1,2; n2:/dev/shm/x: ranks 0,1,3)"
    assert [r.step for r in local_rows(events, shared_newest=14)] == [16]
    assert local_rows([*events, IndexEvent("local_cleared", 4.0, {})], None) == []
    assert local_rows([*events, IndexEvent("rollback", 4.0, {"step": 10})], None) == []  # a rollback: they would undo it
    assert [r.step for r in local_rows([*events, IndexEvent("rollback", 4.0, {"step": 10}), saved(12, 5.0)], 10)] == [12]
    garbage = IndexEvent("local_saved", 1.0, {"step": 8, "holders": "not a mapping"})
    assert local_rows([garbage], None)[0].path == "node-local ()"
    assert local_rows([IndexEvent("local_saved", 1.0, {"step": 8, "holders": {"n": 5}})], None)[0].path == "node-local (n: ranks )"
