"""core.contents_rules and core.export_plan: placements, quarantine names, du buckets, export names,
batches and the safetensors header. Pure."""

from __future__ import annotations

import json

import pytest

from ckpt_tool.core.contents_rules import bucket, parse_quarantined, placement
from ckpt_tool.core.export_plan import TensorEntry, batches, export_entries, safetensors_header, unsupported_dtypes


def test_placement_says_how_the_chunks_split_a_tensor():
    assert placement([8, 4], [((0, 0), (8, 4))]) == "whole"
    assert placement([8, 4], [((0, 0), (4, 4)), ((4, 0), (4, 4))]) == "dim 0 / 2"
    grid = [((r, c), (4, 2)) for r in (0, 4) for c in (0, 2)]
    assert placement([8, 4], grid) == "dim 0 / 2 x dim 1 / 2"
    assert placement([8, 4], [((0, 0), (4, 4)), ((4, 0), (4, 2)), ((4, 2), (4, 2))]) == "3 chunks"  # no grid


def test_quarantined_names_and_du_buckets():
    q = parse_quarantined("step_00000020.1796215123000000000")
    assert q is not None and q.step == 20 and q.moved_ns == 1796215123000000000
    assert parse_quarantined("step_20.x") is None and parse_quarantined("../etc") is None
    assert bucket("step_00000040") == "checkpoint" and bucket(".step_00000050.partial") == "save in progress"
    assert bucket("quarantine") == "quarantine" and bucket("LATEST") == "bookkeeping" and bucket("notes.txt") == "other"


def t(key: str, shape: tuple[int, ...], dtype: str = "float32", itemsize: int = 4) -> TensorEntry:
    return TensorEntry(key, shape, dtype, itemsize)


def test_export_names_model_tensors_as_the_model_does_and_keeps_optimizer_keys():
    table = [t("model.w", (2, 3)), t("optim.state.w.exp_avg", (2, 3)), t("model.b", (3,)), t("probe.inputs", (4, 8), "int64", 8)]
    assert [e.name for e in export_entries(table, model_only=False)] == ["w", "optim.state.w.exp_avg", "b"]
    assert [e.name for e in export_entries(table, model_only=True)] == ["w", "b"]
    clash = [t("model.optim.state.w.exp_avg", (1,)), t("optim.state.w.exp_avg", (1,))]
    assert [e.name for e in export_entries(clash, model_only=False)] == ["model.optim.state.w.exp_avg", "optim.state.w.exp_avg"]


def test_batches_hold_at_most_the_largest_tensor_and_keep_the_order():
    entries = export_entries([t(f"model.{i}", (n,)) for i, n in enumerate([10, 3, 4, 2, 10, 1])], model_only=True)
    groups = batches(entries, 0)
    assert [[e.name for e in g] for g in groups] == [["0"], ["1", "2", "3"], ["4"], ["5"]]
    assert all(sum(e.tensor.nbytes for e in g) <= 40 for g in groups)


def test_the_safetensors_header_is_the_formats_own():
    entries = export_entries([t("model.a", (2, 2)), t("model.b", (3,), "bfloat16", 2), t("model.c", ())], model_only=True)
    raw = safetensors_header(entries, {"format": "pt"})
    n = int.from_bytes(raw[:8], "little")
    assert len(raw) == 8 + n and n % 8 == 0
    header = json.loads(raw[8:])
    assert header["a"] == {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    assert header["b"] == {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}
    assert header["c"]["data_offsets"] == [22, 26] and header["__metadata__"] == {"format": "pt"}
    assert unsupported_dtypes(export_entries([t("model.z", (1,), "complex64", 8)], True)) == ["z: complex64"]


def test_safetensors_reads_a_header_written_here(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    import torch

    entries = export_entries([t("model.a", (2, 2)), t("model.b", (3,), "int64", 8)], model_only=True)
    a, b = torch.arange(4.0).reshape(2, 2), torch.tensor([7, 8, 9])
    (tmp_path / "x.safetensors").write_bytes(safetensors_header(entries, {}) + a.numpy().tobytes() + b.numpy().tobytes())
    got = st.load_file(tmp_path / "x.safetensors")
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)
