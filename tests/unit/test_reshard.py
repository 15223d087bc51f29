import pytest

from ckpt_tool.core.batch import BatchConfig, BatchRequest
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.core.reshard_plan import check_shapes, copy_in_one_process, plan_batch, step_slices
from ckpt_tool.errors import CkptError

dp = Mesh.data_parallel


@pytest.mark.parametrize(
    "old, new_dp, expect",
    [
        (BatchConfig(4, 1, 4), 3, None),  # 16 not divisible by 3: refused (below)
        (BatchConfig(3, 1, 4), 3, BatchConfig(2, 2, 3)),  # G=12: micro 3 does not divide 4 per rank; 2 does
        (BatchConfig(4, 2, 2), 1, BatchConfig(4, 4, 1)),  # fewer ranks: more accumulation, same micro-batch
        (BatchConfig(4, 4, 1), 2, BatchConfig(4, 2, 2)),
        (BatchConfig(8, 1, 64), 48, None),  # 512 / 48 not integral: refused
        (BatchConfig(2, 3, 64), 48, BatchConfig(2, 4, 48)),  # 384 on 48 ranks: 8 per rank
    ],
)
def test_plan_keeps_the_global_batch(old, new_dp, expect):
    if expect is None:
        with pytest.raises(CkptError) as err:
            plan_batch(old, new_dp)
        assert "not divisible" in err.value.message and "nearest" in err.value.hint
        return
    plan = plan_batch(old, new_dp)
    assert plan.new == expect
    assert plan.new.global_batch == old.global_batch


def test_refusal_lists_nearest_world_sizes_and_global_batches():
    with pytest.raises(CkptError) as err:
        plan_batch(BatchConfig(4, 1, 4), 3)  # G = 16
    assert "nearest: 2 or 4" in err.value.hint and "15 or 18" in err.value.hint


def test_a_global_batch_smaller_than_the_world_size_names_one_global_batch():
    with pytest.raises(CkptError) as err:
        plan_batch(BatchConfig(8, 1, 2), 32)  # G = 16 on 32 ranks
    assert "to 32 (a multiple of 32" in err.value.hint and "32 or 32" not in err.value.hint and "nearest: 16" in err.value.hint


def test_a_requested_micro_batch_is_used_when_it_divides_and_refused_when_not():
    assert plan_batch(BatchConfig(4, 1, 4), 2, micro_batch=2).new == BatchConfig(2, 4, 2)
    with pytest.raises(CkptError) as err:
        plan_batch(BatchConfig(8, 1, 2), 2, micro_batch=3)  # 8 per rank
    assert err.value.exit_code == 2 and "--micro-batch 3 does not divide" in err.value.message
    assert err.value.hint == "micro-batches that do: 1, 2, 4, 8"


def test_a_preferred_micro_batch_gives_way_to_the_largest_that_divides():
    assert plan_batch(BatchConfig(8, 1, 2), 2, prefer=3).new == BatchConfig(2, 4, 2)


@pytest.mark.parametrize("batch", [BatchConfig(4, 1, 3), BatchConfig(2, 2, 3), BatchConfig(1, 12, 1), BatchConfig(3, 1, 4)])
def test_step_slices_tile_the_global_batch_exactly(batch):
    slices = step_slices(100, batch)
    covered = sorted(i for start, end in slices.values() for i in range(start, end))
    assert covered == list(range(100, 100 + batch.global_batch))


def test_shape_check():
    assert check_shapes({"w": (8, 4), "b": (8,), "scalar": ()}, 8) == []
    assert [str(p) for p in check_shapes({"w": (2, 4), "b": (8,)}, 4)] == ["w: dim 0 has 2 rows, fewer than 4 ranks"]


def test_plan_resume_order_demand_then_recorded_then_default():
    from ckpt_tool.core.reshard_plan import plan_resume

    saved = BatchConfig(3, 1, 4)  # G = 12
    lineage = [{"event": "reshard_plan", "world_size": 2, "batch": {"micro_batch": 2, "grad_accum": 3, "dp_size": 2, "global_batch": 12}}]
    assert plan_resume(saved, dp(4), [], dp(2)).new == BatchConfig(3, 2, 2)  # default: the saved micro-batch divides 6
    assert plan_resume(saved, dp(4), lineage, dp(2)).new == BatchConfig(2, 3, 2)  # recorded for this size
    assert plan_resume(saved, dp(4), lineage, dp(3)).new == BatchConfig(2, 2, 3)  # recorded for another size: default
    assert plan_resume(saved, dp(4), lineage, dp(2), micro_batch=6).new == BatchConfig(6, 1, 2)  # an explicit demand
    # the command's own micro-batch is kept when it divides, else the largest that does
    assert plan_resume(saved, dp(4), [], dp(2), requested=BatchRequest(micro_batch=6)).new == BatchConfig(6, 1, 2)
    assert plan_resume(saved, dp(4), [], dp(2), requested=BatchRequest(micro_batch=4, grad_accum=1)).new == BatchConfig(3, 2, 2)
    # the checkpoint's global batch wins over one derived from the command (micro x accum x ranks)...
    assert plan_resume(saved, dp(4), [], dp(2), requested=BatchRequest(micro_batch=8, grad_accum=1)).new.global_batch == 12
    # ...unless the command gives it explicitly: a deliberate change
    assert plan_resume(saved, dp(4), [], dp(2), requested=BatchRequest(global_batch=16)).new == BatchConfig(8, 1, 2)
    assert plan_resume(saved, dp(4), [], dp(2), requested=BatchRequest(micro_batch=3, global_batch=12)).new == BatchConfig(3, 2, 2)
    with pytest.raises(CkptError, match="not divisible"):
        plan_resume(saved, dp(4), [], dp(2), requested=BatchRequest(micro_batch=5, global_batch=16))
    # a command without a micro-batch: the recorded plan, else the saved micro-batch
    assert plan_resume(saved, dp(4), lineage, dp(2), requested=BatchRequest(global_batch=12)).new == BatchConfig(2, 3, 2)
    with pytest.raises(CkptError, match="records no batch split"):
        plan_resume(None, dp(4), [], dp(2))
    damaged = [{"event": "reshard_plan", "world_size": 2, "batch": "garbage"}]
    assert plan_resume(saved, dp(4), damaged, dp(2)).new == BatchConfig(3, 2, 2)


def test_the_offline_copy_runs_in_one_process_when_the_state_fits_half_the_free_memory():
    assert copy_in_one_process(4 << 30, 8 << 30, None)  # exactly half: one process
    assert not copy_in_one_process((4 << 30) + 1, 8 << 30, None)  # more: one process per new rank
    assert copy_in_one_process(100 << 30, 8 << 30, True)  # --one-process is obeyed
    assert not copy_in_one_process(1, 8 << 30, False)  # --per-rank too
