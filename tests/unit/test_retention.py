import pytest

from ckpt_tool.core.retention import RetentionPolicy, steps_to_delete


def test_keeps_last_k():
    assert steps_to_delete([10, 20, 30, 40, 50], 50, RetentionPolicy(keep_last=2)) == [10, 20, 30]


def test_keeps_every_m():
    assert steps_to_delete(range(10, 110, 10), 100, RetentionPolicy(keep_last=2, keep_every=40)) == [10, 20, 30, 50, 60, 70]


def test_never_deletes_latest_nor_anything_newer_after_a_rollback():
    # LATEST was rolled back to 20; 30 and 40 are not retention's to judge.
    assert steps_to_delete([10, 20, 30, 40], 20, RetentionPolicy(keep_last=1)) == [10]


def test_deletes_nothing_without_a_committed_latest():
    assert steps_to_delete([], None, RetentionPolicy(keep_last=1)) == []
    assert steps_to_delete([10], 10, RetentionPolicy(keep_last=1)) == []


@pytest.mark.parametrize("kw", [{"keep_last": 0}, {"keep_last": -1}, {"keep_every": 0}])
def test_policy_refuses_unsafe_values(kw):
    with pytest.raises(ValueError):
        RetentionPolicy(**kw)
