"""The mesh (core.mesh) and the reshard planner across meshes: pure, no torch."""

import pytest

from ckpt_tool.core.batch import BatchConfig, BatchRequest
from ckpt_tool.core.mesh import DIMENSIONS, Mesh, mesh_for, source_rank
from ckpt_tool.core.reshard_plan import plan_resume, step_slices
from ckpt_tool.errors import CkptError, ExitCode

HEADS = {"tp": {"attention heads": 4, "MLP hidden size": 256}}


def tp_mesh(dp: int, tp: int) -> Mesh:
    return Mesh.of([("dp_shard", dp), ("tp", tp)], must_divide=HEADS)


def test_coordinates_are_row_major_and_data_parallel_rank_ignores_tp():
    m = tp_mesh(2, 2)
    assert [m.coordinates(r) for r in range(4)] == [{"dp_shard": a, "tp": b} for a in (0, 1) for b in (0, 1)]
    assert [m.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]  # tp peers share a data-parallel rank
    assert (m.world_size, m.dp_size, m.model_parallel_size) == (4, 2, 2)
    assert all(m.rank_at(m.coordinates(r)) == r for r in range(4))
    hsdp = Mesh.of({"tp": 2, "dp_shard": 2, "dp_replicate": 3})  # a mapping is laid out in DIMENSIONS order
    assert hsdp.names == ("dp_replicate", "dp_shard", "tp") and hsdp.dp_size == 6
    assert [hsdp.dp_rank(r) for r in range(0, 12, 2)] == [0, 1, 2, 3, 4, 5]


def test_names_aliases_and_size_one_dimensions():
    assert Mesh.of([("dp", 4), ("tp", 1)]) == Mesh.data_parallel(4)  # tp 1 and "dp" are only spellings
    with pytest.raises(ValueError, match="unknown mesh dimension 'ep'"):
        Mesh.of({"ep": 2})
    with pytest.raises(ValueError, match="appears twice"):
        Mesh.of([("dp", 2), ("dp_shard", 2)])
    assert set(DIMENSIONS) == {"pp", "dp_replicate", "dp_shard", "cp", "tp"}
    assert [n for n, k in DIMENSIONS.items() if k.tested] == ["dp_shard", "tp"]


def test_json_round_trip_keeps_order_and_limits():
    m = Mesh.of([("tp", 2), ("dp_shard", 3)], must_divide=HEADS)
    assert Mesh.from_json(m.to_json()) == m and m.names == ("tp", "dp_shard")


def test_source_rank_keys_state_by_coordinates():
    old = tp_mesh(2, 2)
    assert [source_rank(old, old, r) for r in range(4)] == [0, 1, 2, 3]  # same mesh: each its own
    assert [source_rank(old, tp_mesh(1, 2), r) for r in range(2)] == [0, 1]  # dp 2 -> 1
    assert [source_rank(old, tp_mesh(2, 1), r) for r in range(2)] == [0, 2]  # tp 2 -> 1: dp coordinate kept
    assert [source_rank(old, tp_mesh(4, 1), r) for r in range(4)] == [0, 2, 0, 2]
    assert [source_rank(Mesh.data_parallel(4), Mesh.data_parallel(3), r) for r in range(3)] == [0, 1, 2]
    assert [source_rank(Mesh.data_parallel(2), Mesh.data_parallel(4), r) for r in range(4)] == [0, 1, 0, 1]


def test_mesh_for_keeps_model_parallel_sizes_unless_told():
    saved = tp_mesh(16, 4)  # the 64-GPU run
    assert mesh_for(48, saved).dims == (("dp_shard", 12), ("tp", 4))  # 64 -> 48 GPUs: 4 x 12
    assert mesh_for(2, tp_mesh(2, 2), {"tp": 1}).dims == (("dp_shard", 2),)
    with pytest.raises(CkptError) as err:
        mesh_for(6, saved)
    assert err.value.exit_code == ExitCode.USAGE and "not a multiple of 4" in err.value.message
    assert "nearest: 4 or 8" in err.value.hint


def test_plan_for_the_64_to_48_gpu_case_keeps_the_global_batch():
    saved = BatchConfig(4, 3, 16)  # 64 GPUs: tp 4 x dp 16, micro-batch 4 x accumulation 3: global batch 192
    plan = plan_resume(saved, tp_mesh(16, 4), [], mesh_for(48, tp_mesh(16, 4)))
    assert plan.new_mesh is not None and plan.new_mesh.describe() == "dp_shard 12 x tp 4"
    assert plan.new == BatchConfig(4, 4, 12) and plan.new.global_batch == 192  # more accumulation, same micro-batch
    assert plan.to_json()["mesh"] == {"old": "dp_shard=16,tp=4", "new": "dp_shard=12,tp=4"}


def test_a_data_parallel_size_that_does_not_divide_the_batch_is_refused_in_world_sizes():
    saved = BatchConfig(4, 1, 16)  # G = 64
    with pytest.raises(CkptError) as err:
        plan_resume(saved, tp_mesh(16, 4), [], tp_mesh(10, 4))
    assert "64 cannot be split over 10 data-parallel ranks" in err.value.message
    assert "nearest: 8 or 16, i.e. 32 or 64 ranks" in err.value.hint


@pytest.mark.parametrize(
    "tp, nearest",
    [(3, "tp sizes that fit: 2 or 4"), (8, "tp sizes that fit: 4")],
)
def test_a_tp_size_that_does_not_divide_the_heads_is_refused_with_sizes_that_fit(tp, nearest):
    with pytest.raises(CkptError) as err:
        plan_resume(BatchConfig(2, 1, 4), tp_mesh(4, 2), [], tp_mesh(1, tp))
    assert err.value.exit_code == ExitCode.CONFLICT
    assert f"tp {tp} does not divide the attention heads (4)" in err.value.message
    assert nearest in err.value.hint


def test_dimensions_that_cannot_change_are_refused():
    saved = Mesh.of({"pp": 4, "dp_shard": 2})
    with pytest.raises(CkptError, match="changing pipeline stages"):
        plan_resume(BatchConfig(2, 1, 2), saved, [], Mesh.of({"pp": 2, "dp_shard": 4}))
    same_pp = plan_resume(BatchConfig(2, 1, 2), saved, [], Mesh.of({"pp": 4, "dp_shard": 1}))
    assert same_pp.new == BatchConfig(2, 2, 1)


def test_a_recorded_plan_applies_to_its_mesh_only():
    saved = BatchConfig(2, 1, 2)  # G = 4 on tp 2 x dp 2
    lineage = [{"event": "reshard_plan", "mesh": [["dp_shard", 1], ["tp", 2]], "batch": {"micro_batch": 1, "grad_accum": 4, "dp_size": 1}}]
    assert plan_resume(saved, tp_mesh(2, 2), lineage, tp_mesh(1, 2)).new == BatchConfig(1, 4, 1)
    assert plan_resume(saved, tp_mesh(2, 2), lineage, Mesh.data_parallel(1)).new == BatchConfig(2, 2, 1)  # another mesh


def test_the_command_batch_split_uses_the_data_parallel_size():
    requested = BatchRequest(global_batch=16)
    assert requested.resolve(tp_mesh(2, 2).dp_size) == BatchConfig(8, 1, 2)
    # tp peers take the same slices: the slices of the data-parallel ranks tile the global batch
    slices = step_slices(0, BatchConfig(2, 2, 2))
    assert sorted(slices.values()) == [(0, 2), (2, 4), (4, 6), (6, 8)]
