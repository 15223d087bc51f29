"""The run's event log, ``RUN_DIR/events.jsonl``: one JSON object per line, appended and fsynced.

Written by ``ckpt run`` (starts, deaths, hangs, restarts), ``ckpt recover`` and the sbatch
script (job starts, requeues, the final state, through ``ckpt note``); read by ``ckpt status``
and ``ckpt history``. A torn last line (a crash mid-append) is skipped when reading.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ckpt_tool.store.durable import append_line

EVENTS_NAME = "events.jsonl"


def note(run_dir: Path, event: str, **data: Any) -> dict[str, Any]:
    record = {"time": time.time(), "event": event, **data}
    run_dir.mkdir(parents=True, exist_ok=True)
    append_line(run_dir / EVENTS_NAME, json.dumps(record, sort_keys=True, default=str) + "\n")
    return record


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / EVENTS_NAME).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            out.append(record)
    return out
