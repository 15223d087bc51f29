"""Event logs: one JSON object per line, appended (the checkpoint directory's ``index.jsonl`` and
the run directory's ``events.jsonl`` share the shape ``{"event": str, "time": float, ...}``).

Pure parsing and formatting. A crash can leave a torn last line; the next append starts a new
line (``store.durable.append_line``), so only the torn record is lost. Lines that are not events
are skipped and reported by number, never silently dropped.
Index events: ``commit`` (step, bytes), ``validated`` / ``verified`` (step, ok, detail),
``quarantine`` (step, reason), ``rollback`` (from, to, reason), ``delete`` (step, reason),
``cleanup`` (name, reason), ``roll_forward`` (step), ``repair_latest`` (step, reason).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IndexEvent:
    """One record of an event log: its name, its time (epoch seconds; 0.0 when the record has none) and
    every other field."""

    event: str
    time: float
    data: Mapping[str, Any]

    @property
    def step(self) -> int | None:
        """The record's ``step`` field when it is an integer (not a bool); None otherwise."""
        step = self.data.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None


@dataclass(frozen=True)
class EventLog:
    """The readable events of a log, in file order, and the lines skipped as unreadable."""

    events: tuple[IndexEvent, ...]
    skipped: tuple[int, ...] = ()  # 1-based numbers of the lines that are not events

    def skipped_note(self, name: str) -> str | None:
        """What a person should be told about the skipped lines, or None."""
        if not self.skipped:
            return None
        lines = ", ".join(map(str, self.skipped[:10])) + (", ..." if len(self.skipped) > 10 else "")
        return f"{name}: {len(self.skipped)} line(s) are not readable events and were skipped (line {lines}; a write cut short by a crash?)"


def format_event(event: str, time: float, **data: Any) -> str:
    """One log line: ``{"event": event, "time": time, ...data}`` as JSON with sorted keys and a final newline."""
    return json.dumps({"event": event, "time": time, **data}, sort_keys=True) + "\n"


def parse_records(lines: Iterable[str]) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
    """The event records of a JSON-lines log, and the numbers of the lines that are not one."""
    records, skipped = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
            skipped.append(number)
            continue
        records.append(obj)
    return records, tuple(skipped)


def parse_index(lines: Iterable[str]) -> EventLog:
    """The events of a log's lines; lines that are not events are skipped and counted in
    ``EventLog.skipped``, never raised."""
    records, skipped = parse_records(lines)
    events = []
    for obj in records:
        time = obj.get("time")
        data = {k: v for k, v in obj.items() if k not in ("event", "time")}
        events.append(IndexEvent(obj["event"], float(time) if isinstance(time, (int, float)) and not isinstance(time, bool) else 0.0, data))
    return EventLog(tuple(events), skipped)


@dataclass(frozen=True)
class CheckState:
    """What the index says of one step since its last commit: committed, validated, verified or invalid."""

    status: str
    validated_at: float | None = None


def check_states(events: Iterable[IndexEvent]) -> dict[int, CheckState]:
    """Per step: the outcome of the checks recorded since the step's last commit. A failed last
    check makes it ``invalid``; a later pass makes it ``validated`` (or ``verified``) again."""
    states: dict[int, CheckState] = {}
    for ev in events:
        step = ev.step
        if step is None:
            continue
        if ev.event in ("commit", "roll_forward") or (ev.event == "repair_latest" and step not in states):
            states[step] = CheckState("committed")
        elif ev.event in ("validated", "verified"):
            current = states.get(step, CheckState("committed"))
            validated_at = ev.time if ev.event == "validated" else current.validated_at
            if not ev.data.get("ok"):
                status = "invalid"
            elif ev.event == "verified" or current.status != "verified":
                status = ev.event
            else:
                status = current.status
            states[step] = CheckState(status, validated_at)
    return states


def known_invalid(events: Iterable[IndexEvent]) -> set[int]:
    """Steps whose last check since their last commit failed."""
    return {step for step, state in check_states(events).items() if state.status == "invalid"}
