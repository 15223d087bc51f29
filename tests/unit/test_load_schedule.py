"""core/load_schedule.py: each needed file gets one reader among the ranks that need it, and
what the others need of it becomes a transfer; plain data, no torch."""

from __future__ import annotations

from ckpt_tool.core.load_schedule import Transfer, plan_load


def test_ddp_replicas_split_the_files_between_them_and_send_each_other_the_rest():
    items = [("__0_0.distcp", 0, 600), ("__0_0.distcp", 600, 400), ("__1_0.distcp", 0, 900)]
    schedule = plan_load([items, items], {"__0_0.distcp": 1000, "__1_0.distcp": 900})
    assert schedule.readers == {"__0_0.distcp": 0, "__1_0.distcp": 1}  # the larger file to rank 0, the next to the idle rank 1
    assert schedule.transfers == (
        Transfer(("__0_0.distcp", 0, 600), 0, (1,)),
        Transfer(("__0_0.distcp", 600, 400), 0, (1,)),
        Transfer(("__1_0.distcp", 0, 900), 1, (0,)),
    )
    assert schedule.bytes_read_by(0, {"__0_0.distcp": 1000, "__1_0.distcp": 900}) == 1000


def test_a_shard_is_read_by_its_owner_and_only_the_shared_counters_travel():
    step = [("__0_0.distcp", 0, 8)]  # the optimizer's step counter, saved once, needed by all
    needs = [
        [("__0_0.distcp", 8, 5000), *step],
        [("__1_0.distcp", 0, 5000), *step],
        [("__2_0.distcp", 0, 5000), *step],
    ]
    schedule = plan_load(needs, {"__0_0.distcp": 5008, "__1_0.distcp": 5000, "__2_0.distcp": 5000})
    assert schedule.readers == {"__0_0.distcp": 0, "__1_0.distcp": 1, "__2_0.distcp": 2}
    assert schedule.transfers == (Transfer(("__0_0.distcp", 0, 8), 0, (1, 2)),)


def test_hsdp_replicas_of_a_shard_split_the_reading_and_send_only_to_their_peer():
    shard0, shard1 = [("__0_0.distcp", 0, 4000)], [("__1_0.distcp", 0, 4000)]  # 2 x 2: ranks 0, 2 hold shard 0
    schedule = plan_load([shard0, shard1, shard0, shard1], {"__0_0.distcp": 4000, "__1_0.distcp": 4000})
    assert schedule.readers == {"__0_0.distcp": 0, "__1_0.distcp": 1}
    assert schedule.transfers == (Transfer(("__0_0.distcp", 0, 4000), 0, (2,)), Transfer(("__1_0.distcp", 0, 4000), 1, (3,)))


def test_many_replicas_of_many_files_each_read_one_share():
    files = {f"__{i}_0.distcp": 1000 for i in range(8)}
    items = [(f, 0, 1000) for f in files]
    schedule = plan_load([items] * 4, files)
    assert sorted(schedule.files_read_by(r).__len__() for r in range(4)) == [2, 2, 2, 2]
    assert all(len(t.consumers) == 3 for t in schedule.transfers) and len(schedule.transfers) == 8


def test_a_file_nobody_needs_is_not_read_and_a_rank_with_no_needs_reads_nothing():
    schedule = plan_load([[("a", 0, 10)], []], {"a": 10, "b": 99})
    assert schedule.readers == {"a": 0} and schedule.transfers == () and schedule.files_read_by(1) == []


def test_every_rank_computes_the_same_schedule_from_the_same_needs_in_any_order():
    needs = [[("b", 0, 5), ("a", 0, 5)], [("a", 0, 5), ("b", 0, 5), ("a", 0, 5)]]
    assert plan_load(needs, {"a": 5, "b": 5}) == plan_load([list(reversed(n)) for n in needs], {"b": 5, "a": 5})
