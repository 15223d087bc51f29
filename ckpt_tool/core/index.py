"""The checkpoint directory's index: one JSON object per line, appended under the lock.

Pure parsing and formatting. A crash can leave a torn last line; it is skipped, never fatal.
Events: ``commit`` (step, bytes), ``validated`` / ``verified`` (step, ok, detail),
``quarantine`` (step, reason), ``rollback`` (from, to, reason), ``delete`` (step, reason),
``cleanup`` (name, reason), ``roll_forward`` (step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class IndexEvent:
    event: str
    time: float
    data: Mapping[str, Any]

    @property
    def step(self) -> int | None:
        step = self.data.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None


def format_event(event: str, time: float, **data: Any) -> str:
    return json.dumps({"event": event, "time": time, **data}, sort_keys=True) + "\n"


def parse_index(lines: Iterable[str]) -> list[IndexEvent]:
    events = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # torn write at a crash, or garbage: the index is advisory
        if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
            continue
        time = obj.get("time")
        data = {k: v for k, v in obj.items() if k not in ("event", "time")}
        events.append(IndexEvent(obj["event"], float(time) if isinstance(time, (int, float)) else 0.0, data))
    return events


def committed_steps(events: Iterable[IndexEvent]) -> list[int]:
    """Steps committed and not later quarantined or deleted, in commit order (oldest first)."""
    alive: dict[int, None] = {}
    for ev in events:
        step = ev.step
        if step is None:
            continue
        if ev.event in ("commit", "roll_forward"):
            alive.pop(step, None)
            alive[step] = None
        elif ev.event in ("quarantine", "delete"):
            alive.pop(step, None)
    return list(alive)
