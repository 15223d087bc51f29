"""Retention's whole decision on plain data (``core.retention.plan_prune``): what to delete, and
which kept step must pass validation first; ``store.prune`` only validates what it is asked to
and deletes what the plan names."""

from __future__ import annotations

from ckpt_tool.core.retention import PrunePlan, RetentionPolicy, plan_prune

KEEP_1 = RetentionPolicy(keep_last=1)


def walk(committed, latest, policy, bad=frozenset(), invalid=(), known_good=None):
    """Plan as ``store.prune`` does: validate what the planner asks for (``bad`` fail) until final."""
    checks: dict[int, bool] = {}
    while (decided := plan_prune(committed, latest, policy, invalid, known_good, checks)).check is not None:
        checks[decided.check] = decided.check not in bad
    return decided, list(checks)


def test_the_step_just_committed_vouches_without_a_check():
    decided, checked = walk([10, 20, 30], 30, KEEP_1, known_good=30)
    assert decided == PrunePlan((10, 20), vouched=30) and decided.allowed and checked == []


def test_a_kept_step_that_fails_is_kept_and_the_next_older_one_is_asked_for():
    decided, checked = walk([10, 20, 30], 30, KEEP_1, bad={30})
    assert checked == [30, 20]  # 30 failed: it no longer counts, so 20 is kept in its place and judged
    assert decided == PrunePlan((10,), vouched=20)


def test_failures_only_ever_keep_more_and_an_unjudged_plan_allows_no_delete():
    decided, checked = walk([10, 20, 30], 30, KEEP_1, bad={30, 20})
    assert checked == [30, 20] and decided == PrunePlan(())  # each failure is kept, and keeps an older one
    unchecked = plan_prune([10, 20], 20, KEEP_1)  # no validation given: a step to check, no deletes allowed
    assert unchecked == PrunePlan((10,), check=20) and not unchecked.allowed


def test_no_latest_or_nothing_to_delete_asks_for_no_check():
    assert plan_prune([10, 20], None, KEEP_1) == PrunePlan(())  # a damaged LATEST stops retention
    assert plan_prune([10, 20], 20, RetentionPolicy(keep_last=2)) == PrunePlan(())
    # a step recorded invalid in the index is kept and does not count towards keep_last
    assert walk([10, 20, 30], 30, KEEP_1, invalid={30})[0] == PrunePlan((10,), vouched=20)


def test_a_known_good_step_that_is_not_kept_does_not_vouch():
    assert plan_prune([10, 20, 30], 30, KEEP_1, known_good=10) == PrunePlan((10, 20), check=30)
