"""What a checkpoint holds and what a directory's bytes are: for ``ckpt inspect``, ``ckpt du`` and
``ckpt quarantine``. Pure: names, shapes and sizes in, descriptions out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ckpt_tool.core import layout

_QUARANTINED_RE = re.compile(rf"^step_(\d{{{layout.STEP_DIGITS}}})\.(\d+)$")


def placement(shape: Sequence[int], chunks: Sequence[tuple[Sequence[int], Sequence[int]]]) -> str:
    """How a tensor's saved chunks (offsets, sizes) cover it: ``whole`` (one chunk: replicated, or
    one rank), ``dim 0 / 2`` (split in 2 along dim 0), ``dim 0 / 2 x dim 1 / 4`` (a grid), or
    ``N chunks`` when they form no grid."""
    if len(chunks) <= 1:
        return "whole"
    split = []
    for d in range(len(shape)):
        starts = {tuple(off)[d] for off, _ in chunks}
        if len(starts) > 1:
            split.append((d, len(starts)))
    cells = 1
    for _, n in split:
        cells *= n
    if not split or cells != len(chunks):
        return f"{len(chunks)} chunks"
    return " x ".join(f"dim {d} / {n}" for d, n in split)


@dataclass(frozen=True)
class Quarantined:
    """A checkpoint moved aside into ``quarantine/``: the directory's name there, its step, and when it was
    moved (nanoseconds since the epoch, from the name's suffix)."""

    name: str  # the directory's name in quarantine/
    step: int
    moved_ns: int  # when it was moved there (the name's suffix)


def parse_quarantined(name: str) -> Quarantined | None:
    """``step_00000020.1796215123000000000`` -> step 20, moved at that time (ns); None otherwise."""
    m = _QUARANTINED_RE.match(name)
    return Quarantined(name, int(m.group(1)), int(m.group(2))) if m else None


def bucket(name: str) -> str:
    """What a top-level name of a checkpoint directory is, for ``ckpt du``."""
    entry = layout.parse_entry(name)
    if entry is not None:
        return {
            layout.EntryKind.STEP: "checkpoint",
            layout.EntryKind.PARTIAL: "save in progress",
            layout.EntryKind.DELETING: "delete in progress",
        }[entry.kind]
    if name == layout.QUARANTINE_NAME:
        return "quarantine"
    if name == layout.RUN_DIR_NAME:
        return "run directory (events, job output)"
    if name in (layout.LATEST_NAME, layout.INDEX_NAME, layout.LOCK_NAME, layout.OWNER_NAME):
        return "bookkeeping"
    return "other"
