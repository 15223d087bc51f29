"""The recovery planner on plain data: which step, what is quarantined, how LATEST moves, and
which step it asks to have checked next (so the order of the checks is its decision too)."""

from __future__ import annotations

from ckpt_tool.core.recovery import (
    Checked,
    Damaged,
    MoveLatest,
    Quarantine,
    Remove,
    Resume,
    Rollback,
    Settle,
    Start,
    StoreView,
    plan,
)


def walk(facts: StoreView, intent, bad: set[int] = frozenset()):
    """Plan as the executor does: check what the planner asks for (``bad`` fail) until final."""
    checks: dict[int, Checked] = {}
    while (decided := plan(facts, intent, checks)).check is not None:
        step = decided.check
        checks[step] = Checked(step, step not in bad, ("hash mismatch",) if step in bad else ())
    return decided, list(checks)


def test_rollback_walks_back_from_the_one_before_latest_until_a_step_passes():
    facts = StoreView(committed=(10, 20, 30, 40), step_dirs=(10, 20, 30, 40), latest=40)
    decided, checked = walk(facts, Rollback(reason="ckpt recover: step 40 is damaged"), bad={30})
    assert checked == [30, 20] and decided.step == 20 and decided.tried == (30,)
    assert decided.actions == (
        Quarantine(30, "ckpt recover: step 40 is damaged: hash mismatch"),
        Quarantine(40, "ckpt recover: step 40 is damaged: rolled back to 20"),
        MoveLatest(20, "ckpt recover: step 40 is damaged"),
    )


def test_auto_rollback_starts_at_latest_and_a_passing_latest_moves_nothing():
    facts = StoreView(committed=(10, 20), step_dirs=(10, 20), latest=20)
    decided, checked = walk(facts, Rollback(auto=True))
    assert checked == [20] and decided.step == 20 and decided.actions == ()


def test_rollback_names_why_latest_was_not_trusted_and_quarantines_uncommitted_dirs_after_the_target():
    facts = StoreView(committed=(10, 20), step_dirs=(10, 20, 30), latest=None, latest_problem="LATEST is damaged")
    decided, _ = walk(facts, Rollback(to=10, reason="manual rollback"))
    assert decided.quarantined == (20, 30)
    assert decided.actions[-1] == MoveLatest(10, "manual rollback (LATEST is damaged)")


def test_rollback_with_nothing_valid_left_has_no_step_and_says_what_was_tried():
    decided, _ = walk(StoreView(committed=(10, 20, 30), latest=30), Rollback(), bad={10, 20})
    assert decided.step is None and decided.tried == (20, 10) and decided.actions == ()


def test_settle_removes_leftovers_and_rolls_forward_onto_valid_newer_steps_only():
    facts = StoreView(committed=(10, 20, 30, 40), latest=20, leftovers=((".step_00000050.partial", "partial"),))
    decided, checked = walk(facts, Settle(), bad={30})
    assert checked == [30, 40]  # oldest first: each roll-forward builds on the one before
    assert decided.step == 40
    assert decided.actions == (
        Remove(".step_00000050.partial", "partial"),
        Quarantine(30, "newer than LATEST and not valid", "quarantined step_00000030 (newer than LATEST, not valid)"),
        MoveLatest(
            40,
            "",
            "roll_forward",
            previous=20,
            says="LATEST moved forward to step_00000040 (committed, pointer not yet moved at the crash)",
        ),
    )
    assert decided.lines[0] == "removed .step_00000050.partial (left by a crash)"


def test_settle_without_a_check_trusts_nothing_newer_than_latest():
    decided, checked = walk(StoreView(committed=(10, 20), latest=10), Settle(can_check=False))
    assert checked == [] and decided.step == 10 and decided.quarantined == (20,)


def test_settle_repairs_a_missing_latest_onto_the_newest_valid_step_and_names_the_cause():
    facts = StoreView(committed=(10, 20, 30), latest=None, latest_problem="LATEST is damaged: not a step")
    decided, checked = walk(facts, Settle(), bad={30})
    assert checked == [30, 20] and decided.step == 20
    assert decided.lines == [
        "quarantined step_00000030 (not valid; LATEST is damaged: not a step)",
        "LATEST is damaged: not a step: LATEST now names step_00000020, the newest valid checkpoint",
    ]
    assert decided.actions[-1].event == "repair_latest"
    assert "LATEST was missing" in walk(StoreView(committed=(10,)), Settle())[0].lines[0]


def test_resume_takes_latest_or_falls_back_to_the_newest_committed_step():
    assert plan(StoreView(committed=(10, 20), latest=20), Resume()).step == 20
    assert plan(StoreView(committed=()), Resume()).step is None  # a fresh start
    moved = plan(StoreView(committed=(10, 20), latest=30, latest_problem="LATEST names step 30, which is gone"), Resume())
    assert moved.step == 20 and moved.actions == (
        MoveLatest(20, "LATEST names step 30, which is gone", says="LATEST names step 30, which is gone (LATEST moved to step 20)"),
    )
    none_left = plan(StoreView(committed=(), latest_problem="LATEST is damaged"), Resume())
    assert none_left.step is None and none_left.problem == "LATEST is damaged, and no committed checkpoint is left"


def test_damage_found_by_the_ranks_quarantines_the_step_and_moves_latest_back_one():
    decided = plan(StoreView(committed=(10, 20, 30), latest=30), Damaged(30, ("a", "b", "c", "d", "e", "f")))
    assert decided.step == 20
    assert decided.actions == (
        Quarantine(30, "a; b; c; d; e", "step 30 (damaged and quarantined, see above)"),
        MoveLatest(20, "step 30 damaged: a; b; c; d; e"),
    )
    oldest = plan(StoreView(committed=(10,), latest=10), Damaged(10, ("x",)))
    assert oldest.step is None and oldest.quarantined == (10,) and len(oldest.actions) == 1


def test_rollback_refuses_in_the_planner_before_any_step_is_checked():
    """Nowhere to go is the planner's decision too: ops.rollback only words it."""
    from ckpt_tool.core.recovery import Refusal

    nothing = plan(StoreView(committed=(), step_dirs=(30,), latest=None), Rollback())
    assert nothing.refused is Refusal.NO_CHECKPOINT and nothing.check is None and nothing.step is None
    facts = StoreView(committed=(10, 20), step_dirs=(10, 20, 30), latest=20)
    gone = plan(facts, Rollback(to=40))
    assert gone.refused is Refusal.NO_SUCH_STEP and gone.check is None  # not even step 40 is asked for
    torn = plan(facts, Rollback(to=30))
    assert torn.refused is Refusal.NOT_COMMITTED and torn.check is None and torn.actions == ()
    decided, checked = walk(facts, Rollback(), bad={10})
    assert decided.refused is Refusal.NONE_VALID and checked == [10] and decided.tried == (10,)
    assert decided.problem == "no valid checkpoint to roll back to"
    assert walk(facts, Rollback(to=10))[0].refused is None  # a committed target is checked, not refused


def test_the_start_keeps_a_latest_that_passes_and_checks_nothing_else():
    facts = StoreView(committed=(10, 20, 30), step_dirs=(10, 20, 30), latest=30)
    decided, checked = walk(facts, Start())
    assert checked == [30] and decided.step == 30 and decided.actions == ()


def test_the_start_rolls_back_past_a_damaged_latest_as_ckpt_rollback_would():
    facts = StoreView(committed=(10, 20, 30), step_dirs=(10, 20, 30), latest=30)
    decided, checked = walk(facts, Start(), bad={30, 20})
    assert checked == [30, 20, 10] and decided.step == 10 and decided.tried == (20,)
    assert decided.actions == (
        Quarantine(20, "ckpt recover: step 30 is damaged: hash mismatch"),
        Quarantine(30, "ckpt recover: step 30 is damaged: rolled back to 10"),
        MoveLatest(10, "ckpt recover: step 30 is damaged"),
    )


def test_the_start_with_latest_on_a_missing_step_rolls_back_from_the_newest_committed():
    facts = StoreView(committed=(10, 20), step_dirs=(10, 20), latest=30, latest_problem="LATEST names step 30, which does not exist")
    decided, checked = walk(facts, Start())
    assert checked == [20] and decided.step == 20
    assert decided.actions == (MoveLatest(20, "ckpt recover: LATEST is missing or damaged (LATEST names step 30, which does not exist)"),)
