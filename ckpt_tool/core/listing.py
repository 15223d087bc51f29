"""What ``ckpt list`` shows: one row per checkpoint with its status. Pure.

Status order: partial (a save in progress or left by a crash) < committed (manifest present) <
validated (hashes checked) < verified (probe checks passed); ``invalid`` when the last check
failed; ``quarantined`` when moved aside. Summaries come from the index's commit events, so
listing reads no manifest (``summaries`` fills in steps the index does not know).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ckpt_tool.core import layout
from ckpt_tool.core.index import IndexEvent


@dataclass(frozen=True)
class Row:
    step: int
    status: str
    latest: bool
    path: str
    bytes: int | None = None
    world_size: int | None = None
    global_batch: int | None = None
    probe_loss: float | None = None
    committed_at: float | None = None
    last_validated: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _status(step: int, events_by_step: Mapping[int, list[IndexEvent]]) -> tuple[str, float | None]:
    status, validated_at = "committed", None
    for ev in events_by_step.get(step, []):
        if ev.event in ("commit", "roll_forward"):
            status = "committed"
        elif ev.event in ("validated", "verified"):
            ok = bool(ev.data.get("ok"))
            if ev.event == "validated":
                validated_at = ev.time
            if not ok:
                status = "invalid"
            elif ev.event == "verified" or status != "verified":
                status = ev.event
    return status, validated_at


def build_rows(
    committed: Iterable[int],
    partial: Iterable[int],
    quarantined: Iterable[tuple[int, str]],
    events: Iterable[IndexEvent],
    latest: int | None,
    summaries: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[Row]:
    by_step: dict[int, list[IndexEvent]] = {}
    last_commit: dict[int, Mapping[str, Any]] = {}
    for ev in events:
        if ev.step is None:
            continue
        if ev.event == "commit":
            by_step[ev.step] = []  # a new commit of the step starts its history afresh
            last_commit[ev.step] = ev.data
        by_step.setdefault(ev.step, []).append(ev)
    rows = []
    for step in committed:
        info = {**(summaries or {}).get(step, {}), **last_commit.get(step, {})}
        status, validated_at = _status(step, by_step)
        rows.append(
            Row(
                step,
                status,
                step == latest,
                layout.step_dir_name(step),
                info.get("bytes"),
                info.get("world_size"),
                info.get("global_batch"),
                info.get("probe_loss"),
                info.get("created_at"),
                validated_at,
            )
        )
    rows += [Row(step, "partial", False, layout.partial_dir_name(step)) for step in partial]
    rows += [Row(step, "quarantined", False, f"quarantine/{name}") for step, name in quarantined]
    return sorted(rows, key=lambda r: (r.step, r.status))
