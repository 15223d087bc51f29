"""`ckpt diff`'s decisions on plain data (core.ckpt_diff) and its measure of two tensors
(ops.diff.measure): which entries compare, what differs by how much, and the sentence."""

from __future__ import annotations

import math

import torch

from ckpt_tool.core.ckpt_diff import Numbers, judge_pair, make_report, pair_entries
from ckpt_tool.core.export_plan import TensorEntry
from ckpt_tool.ops.diff import CHUNK, measure


def entry(key, shape=(4,), dtype="float32", itemsize=4):
    return TensorEntry(key, shape, dtype, itemsize)


def test_entries_pair_by_key_and_the_rest_say_why_they_cannot():
    a = [entry("model.w"), entry("model.b", (2,)), entry("model.h", (3,)), entry("optim.x"), entry("model.old")]
    b = [entry("model.w"), entry("model.b", (4,)), entry("model.h", (3,), "bfloat16", 2), entry("optim.x"), entry("model.new")]
    pairs, rest = pair_entries(a, b)
    assert [p[0].key for p in pairs] == ["model.w", "optim.x"]
    assert [(e.key, e.status) for e in rest] == [
        ("model.b", "shape"),
        ("model.h", "dtype"),
        ("model.old", "only_a"),
        ("model.new", "only_b"),
    ]


def test_the_report_says_identical_or_what_differs_most_and_the_facts():
    a, b = entry("model.w"), entry("model.v")
    same = judge_pair(a, a, Numbers(4, 0, 0.0, 0.0))
    off = judge_pair(b, b, Numbers(4, 1, 0.5, 0.25))
    facts_a = {"run_id": "r1", "step": 10, "world_size": 2, "mesh_text": "dp_shard 2", "batch_text": None}
    facts_b = {**facts_a, "run_id": "r2", "world_size": 1, "mesh_text": "dp_shard 1"}
    report = make_report(facts_a, facts_b, [same], [])
    assert (
        report.identical
        and report.summary() == "identical: all 1 entries bit for bit (run: r1 -> r2, world size: 2 -> 1, mesh: dp_shard 2 -> dp_shard 1)"
    )
    report = make_report(facts_a, facts_a, [same, off], pair_entries([entry("model.z")], [])[1])
    assert not report.identical and report.counts() == {"identical": 1, "differs": 1, "only_a": 1}
    assert report.summary() == "1 of 3 entries identical; 1 differ (largest: model.v, max abs 0.5, max rel 0.25); 1 only in A"
    j = report.to_json()
    assert j["identical"] is False and j["entries"][1]["max_abs"] == 0.5 and j["facts_differ"] == []


def test_measure_counts_bits_and_takes_the_largest_differences():
    a = torch.tensor([1.0, 2.0, float("nan"), 4.0, 0.0, -0.0])
    b = torch.tensor([1.0, 2.5, float("nan"), float("nan"), -0.0, -0.0])
    n = measure(a, b)
    assert (n.elements, n.differing, n.nan_mismatch) == (6, 3, 1)  # 2.0/2.5, 4.0/NaN, 0.0/-0.0 (bits)
    assert n.max_abs == 0.5 and n.max_rel == 0.2  # NaN in both places is the same wrong number
    assert measure(a, a.clone()) == Numbers(6, 0, 0.0, 0.0)
    ints = measure(torch.tensor([1, 5, 9], dtype=torch.int64), torch.tensor([1, 2, 9], dtype=torch.int64))
    assert (ints.differing, ints.max_abs, ints.max_rel) == (1, 3.0, 0.6)
    inf = measure(torch.tensor([float("inf")]), torch.tensor([-float("inf")]))
    assert inf.differing == 1 and math.isinf(inf.max_abs)


def test_measure_goes_chunk_by_chunk_and_finds_a_difference_in_the_last_one():
    a = torch.zeros(CHUNK + 3)
    b = a.clone()
    b[-1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)) - 1.0  # one tiny value past the first chunk
    n = measure(a, b)
    assert n.elements == CHUNK + 3 and n.differing == 1 and n.max_abs == float(b[-1]) and n.max_rel == 1.0
