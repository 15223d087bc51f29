"""A stop of `ckpt run` says what it is for only as far as it knows: USR1 (the time-limit
warning) is for a requeue; after a TERM (scancel, the time limit, a preemption) the batch script
decides, so no requeue is claimed (before: 'then exit for requeue' after a scancel too)."""

from __future__ import annotations

from ckpt_tool.core.stop_purpose import stop_purpose, stopped_note


def test_usr1_is_a_stop_for_requeue():
    purpose, note = stop_purpose({"USR1"})
    assert purpose == "requeue" and "exit 75 for requeue" in note and "time-limit warning" in note
    assert stopped_note(purpose) == "checkpoint committed: exit 75 for requeue"


def test_a_term_claims_no_requeue():
    for signals in ({"TERM"}, {"TERM", "USR1"}):  # scancel: TERM from SLURM and USR1 from the batch script's trap
        purpose, note = stop_purpose(signals)
        assert purpose == "stop" and "for requeue" not in note and "scancel" in note and "the batch script requeues only" in note
        assert "for requeue" not in stopped_note(purpose) and "batch script's decision" in stopped_note(purpose)


def test_a_round_end_leaves_the_node_behind():
    assert stop_purpose({"USR1"}, leave_node_behind=True) == (
        "leave_node",
        "checkpoint at the next step, then leave the suspect node behind",
    )
