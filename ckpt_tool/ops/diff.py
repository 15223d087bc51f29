"""``ckpt diff A B``: two checkpoints compared entry by entry (``core.ckpt_diff`` decides and says).

Safe as ``ckpt export`` is: both steps' files are hash-checked against their manifests first, the
DCP metadata is read without running its pickle, tensors are loaded with ``weights_only``.
Streaming: both checkpoints are read in lockstep a batch at a time (``ops.export.stream``), so
memory is bounded by about twice the largest tensor, not the model; a pair's numbers are taken in
chunks of ``CHUNK`` elements.
"""

from __future__ import annotations

from typing import Any

import torch

from ckpt_tool.core.ckpt_diff import DiffReport, Numbers, judge_pair, make_report, pair_entries
from ckpt_tool.core.export_plan import ExportEntry
from ckpt_tool.ops.export import checked, stream, tensor_table
from ckpt_tool.store.store import CheckpointStore

CHUNK = 1 << 22  # elements per chunk of a pair's comparison (float64 scratch: 32 MiB a side)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def facts(store: CheckpointStore, step: int) -> dict[str, Any]:
    """The run facts of a step that ``core.ckpt_diff.FACTS`` compares, and where it is."""
    m = store.read_manifest(step)
    batch = f"{m.batch.micro_batch} x {m.batch.grad_accum} x {m.batch.dp_size} = {m.batch.global_batch}" if m.batch else None
    return {
        "path": str(store.step_path(step)), "run_id": m.run_id, "step": m.step, "world_size": m.world_size,
        "mesh_text": m.layout.describe(), "batch_text": batch, "probe_loss": m.probe.loss if m.probe else None,
    }  # fmt: skip


def measure(a: torch.Tensor, b: torch.Tensor) -> Numbers:
    """How two flat tensors of one dtype differ (see ``core.ckpt_diff.Numbers``), chunk by chunk."""
    n = a.numel()
    differing = nan_mismatch = 0
    max_abs = max_rel = 0.0
    ints = _INT_OF_SIZE[a.element_size()]
    for start in range(0, n, CHUNK):
        x, y = a[start : start + CHUNK], b[start : start + CHUNK]
        bits_differ = x.view(ints) != y.view(ints)
        if x.is_floating_point():
            xn, yn = torch.isnan(x), torch.isnan(y)
            bits_differ &= ~(xn & yn)  # NaN in both places: the same wrong number, not a difference
            nan_mismatch += int((xn ^ yn).sum())
            compared = bits_differ & ~(xn | yn)
            if bool(compared.any()):
                x64, y64 = x[compared].double(), y[compared].double()
                d = (x64 - y64).abs()
                d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)  # inf against -inf
                max_abs = max(max_abs, float(d.max()))
                max_rel = max(max_rel, _largest_rel(d, torch.maximum(x64.abs(), y64.abs())))
        elif bool(bits_differ.any()):
            d = (x[bits_differ].to(torch.int64) - y[bits_differ].to(torch.int64)).abs().double()
            max_abs = max(max_abs, float(d.max()))
            scale = torch.maximum(x[bits_differ].to(torch.int64).abs(), y[bits_differ].to(torch.int64).abs()).double()
            max_rel = max(max_rel, _largest_rel(d, scale))
        differing += int(bits_differ.sum())
    return Numbers(n, differing, max_abs, max_rel, nan_mismatch)


def _largest_rel(d: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest ``d / scale`` where ``scale`` is positive (0.0 against -0.0 differ in bits, not in value)."""
    positive = scale > 0
    return float((d[positive] / scale[positive]).max()) if bool(positive.any()) else 0.0


def diff_checkpoints(store_a: CheckpointStore, step_a: int, store_b: CheckpointStore, step_b: int) -> DiffReport:
    """Compare step ``step_a`` of ``store_a`` with ``step_b`` of ``store_b``.

    Raises:
        CkptError: either step is damaged or unreadable (as ``ckpt export`` says it).
    """
    checked(store_a, step_a)
    checked(store_b, step_b)
    table_a, _ = tensor_table(store_a, step_a)
    table_b, _ = tensor_table(store_b, step_b)
    pairs, structural = pair_entries(table_a, table_b)
    side_a = [ExportEntry(ta.key, ta) for ta, _ in pairs]
    side_b = [ExportEntry(tb.key, tb) for _, tb in pairs]
    judged = []
    for (ea, bytes_a), (eb, bytes_b) in zip(stream(store_a, step_a, side_a), stream(store_b, step_b, side_b), strict=True):
        dtype = getattr(torch, ea.tensor.dtype)
        if bytes_a == bytes_b:
            numbers = Numbers(ea.tensor.nbytes // ea.tensor.itemsize, 0, 0.0, 0.0)
        else:
            numbers = measure(torch.frombuffer(bytes_a, dtype=dtype), torch.frombuffer(bytes_b, dtype=dtype))
        judged.append(judge_pair(ea.tensor, eb.tensor, numbers))
    return make_report(facts(store_a, step_a), facts(store_b, step_b), judged, structural)
