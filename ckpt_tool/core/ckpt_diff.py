"""``ckpt diff A B``: how two checkpoints differ, entry by entry. Pure: the two tensor tables and
the numbers measured on each pair in, the report and its words out.

Two checkpoints of one run (two steps) or of two runs (two variants, a replay, a resharded copy)
are compared by their DCP keys (``model.<fqn>``, ``optim.state.<fqn>.<name>``, the probe batch):
an entry is ``identical`` (the same bytes), ``differs`` (same shape and dtype, other values: the
largest absolute and relative difference, how many elements), ``shape``/``dtype`` (not
comparable), or only in one of them. The run facts (world size, mesh, batch, the probe's loss)
are compared beside them: a different mesh stores the same tensors, so the entries can still be
identical. This answers "did these two variants behave identically up to this step" and "is
this checkpoint the one that procedure produced".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ckpt_tool.core.export_plan import MODEL_PREFIX, TensorEntry

Status = Literal["identical", "differs", "shape", "dtype", "only_a", "only_b"]


@dataclass(frozen=True)
class Numbers:
    """What comparing two tensors of one shape and dtype measured: how many elements differ
    (bit for bit; a NaN in both places counts as equal), the largest ``|a - b|`` and the largest
    ``|a - b| / max(|a|, |b|)``; ``nan_mismatch``: elements NaN in one and not the other."""

    elements: int
    differing: int
    max_abs: float
    max_rel: float
    nan_mismatch: int = 0


@dataclass(frozen=True)
class EntryDiff:
    """One key's verdict (``status``), its shapes and dtypes on each side, and the numbers when
    both sides were compared."""

    key: str
    status: Status
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    numbers: Numbers | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON-able dict (``numbers`` inlined)."""
        d: dict[str, Any] = {"key": self.key, "status": self.status}
        if self.shape_a is not None:
            d["shape_a"], d["dtype_a"] = list(self.shape_a), self.dtype_a
        if self.shape_b is not None:
            d["shape_b"], d["dtype_b"] = list(self.shape_b), self.dtype_b
        if self.numbers is not None:
            n = self.numbers
            d.update(elements=n.elements, differing=n.differing, max_abs=n.max_abs, max_rel=n.max_rel, nan_mismatch=n.nan_mismatch)
        return d


def pair_entries(a: Sequence[TensorEntry], b: Sequence[TensorEntry]) -> tuple[list[tuple[TensorEntry, TensorEntry]], list[EntryDiff]]:
    """The pairs to compare value by value (same key, shape and dtype), in A's order, and the
    entries that cannot be: a shape or dtype that changed, a key on one side only."""
    by_key = {t.key: t for t in b}
    pairs: list[tuple[TensorEntry, TensorEntry]] = []
    structural: list[EntryDiff] = []
    for ta in a:
        tb = by_key.get(ta.key)
        if tb is None:
            structural.append(EntryDiff(ta.key, "only_a", ta.shape, None, ta.dtype, None))
        elif ta.shape != tb.shape:
            structural.append(EntryDiff(ta.key, "shape", ta.shape, tb.shape, ta.dtype, tb.dtype))
        elif ta.dtype != tb.dtype:
            structural.append(EntryDiff(ta.key, "dtype", ta.shape, tb.shape, ta.dtype, tb.dtype))
        else:
            pairs.append((ta, tb))
    seen = {t.key for t in a}
    structural += [EntryDiff(t.key, "only_b", None, t.shape, None, t.dtype) for t in b if t.key not in seen]
    return pairs, structural


def judge_pair(ta: TensorEntry, tb: TensorEntry, numbers: Numbers) -> EntryDiff:
    """The verdict of a compared pair."""
    status: Status = "identical" if numbers.differing == 0 else "differs"
    return EntryDiff(ta.key, status, ta.shape, tb.shape, ta.dtype, tb.dtype, numbers)


# the run facts compared beside the entries: (label, manifest field)
FACTS = (("run", "run_id"), ("step", "step"), ("world size", "world_size"), ("mesh", "mesh_text"), ("batch", "batch_text"))


@dataclass(frozen=True)
class DiffReport:
    """The whole comparison: both sides' facts, each entry's verdict (A's order, then B's own),
    and the facts that differ."""

    a: Mapping[str, Any]
    b: Mapping[str, Any]
    entries: tuple[EntryDiff, ...]
    facts: tuple[tuple[str, Any, Any], ...] = field(default_factory=tuple)  # (label, in A, in B) that differ

    @property
    def identical(self) -> bool:
        """Every entry identical and none on one side only (the facts may differ: another run id, mesh)."""
        return all(e.status == "identical" for e in self.entries)

    def counts(self) -> dict[str, int]:
        """How many entries of each status."""
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.status] = out.get(e.status, 0) + 1
        return out

    def summary(self) -> str:
        """One sentence: identical, or how many differ and the largest difference (where: the
        model's weights when any differ, else any entry)."""
        c, n = self.counts(), len(self.entries)
        if self.identical:
            return f"identical: all {n} entries bit for bit" + (f" ({self._facts_words()})" if self.facts else "")
        parts = [f"{c.get('identical', 0)} of {n} entries identical"]
        if c.get("differs"):
            differing = [e for e in self.entries if e.numbers is not None and e.status == "differs"]
            weights = [e for e in differing if e.key.startswith(MODEL_PREFIX)]  # what a user looks at first
            worst = max(weights or differing, key=lambda e: _largest(e.numbers))
            assert worst.numbers is not None
            parts.append(
                f"{c['differs']} differ (largest: {worst.key}, max abs {worst.numbers.max_abs:.3g}, max rel {worst.numbers.max_rel:.3g})"
            )
        for status, words in (("shape", "changed shape"), ("dtype", "changed dtype"), ("only_a", "only in A"), ("only_b", "only in B")):
            if c.get(status):
                parts.append(f"{c[status]} {words}")
        return "; ".join(parts) + (f" ({self._facts_words()})" if self.facts else "")

    def _facts_words(self) -> str:
        return ", ".join(f"{label}: {va} -> {vb}" for label, va, vb in self.facts)

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-able dict."""
        return {
            "identical": self.identical, "summary": self.summary(), "a": dict(self.a), "b": dict(self.b), "counts": self.counts(),
            "facts_differ": [{"fact": label, "a": va, "b": vb} for label, va, vb in self.facts],
            "entries": [e.to_json() for e in self.entries],
        }  # fmt: skip


def _largest(n: Numbers | None) -> tuple[int, float]:
    if n is None:
        return (0, 0.0)
    return (n.nan_mismatch, n.max_abs if n.max_abs == n.max_abs else float("inf"))


def make_report(a: Mapping[str, Any], b: Mapping[str, Any], judged: Sequence[EntryDiff], structural: Sequence[EntryDiff]) -> DiffReport:
    """The report: the compared entries, then the structural ones; the facts that differ."""
    facts = tuple((label, a.get(k), b.get(k)) for label, k in FACTS if a.get(k) != b.get(k))
    return DiffReport(a, b, (*judged, *structural), facts)
