"""Does a run's state fit a checkpoint? Pure: entry names and shapes in, differences out.

A checkpoint whose every byte checks out can still not fit the run that loads it: the model or
optimizer changed in the code (a layer added, another optimizer). That is not damage, and must
not send the checkpoint to quarantine: it is reported as a mismatch for the user to resolve.
Shapes are global (DCP's view), ``None`` for a non-tensor entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Shape = Sequence[int] | None


def fit_problems(wanted: Mapping[str, Shape], saved: Mapping[str, Shape], limit: int = 5) -> list[str]:
    """What the run needs that the checkpoint cannot give: missing entries, other shapes, a
    tensor where the checkpoint holds plain data (or the reverse). At most ``limit`` of each
    kind are named, with a count of the rest."""
    missing = sorted(k for k in wanted if k not in saved)
    shapes = sorted(
        k for k in wanted if k in saved and _kind(wanted[k]) == _kind(saved[k]) == "tensor" and tuple(wanted[k]) != tuple(saved[k])
    )  # type: ignore[arg-type]
    kinds = sorted(k for k in wanted if k in saved and _kind(wanted[k]) != _kind(saved[k]))
    problems = []
    if missing:
        problems.append(f"{len(missing)} entries the run needs are not in the checkpoint: {_names(missing, limit)}")
    if shapes:
        problems.append(
            f"{len(shapes)} tensors have another shape: "
            + ", ".join(f"{k} {list(wanted[k])} (saved {list(saved[k])})" for k in shapes[:limit])
            + (", ..." if len(shapes) > limit else "")
        )  # type: ignore[arg-type]
    if kinds:
        problems.append(f"{len(kinds)} entries are a tensor on one side and plain data on the other: {_names(kinds, limit)}")
    return problems


def _kind(shape: Shape) -> str:
    return "data" if shape is None else "tensor"


def _names(keys: list[str], limit: int) -> str:
    return ", ".join(keys[:limit]) + (", ..." if len(keys) > limit else "")
