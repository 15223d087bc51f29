"""The phase durations ``ckpt run`` observed, ``RUN_DIR/timeouts.json``: one writer (the watchdog,
at exit) and one reader (the watchdog at its next start, ``ckpt submit``'s signal lead, ``ckpt plan``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ckpt_tool.core.timeouts import DurationLog
from ckpt_tool.store.durable import atomic_write

DURATIONS_NAME = "timeouts.json"


def read_durations(run_dir: Path) -> DurationLog | None:
    """The phase durations ``ckpt run`` observed in ``run_dir`` (its ``timeouts.json``), or None
    when it has none yet or the file is unreadable. The one reader of the file it writes."""
    try:
        data = json.loads((run_dir / DURATIONS_NAME).read_text())
    except (OSError, ValueError):
        return None
    return DurationLog.from_json(data.get("durations")) if isinstance(data, dict) else None


def write_durations(run_dir: Path, durations: DurationLog, timeouts: Mapping[str, float]) -> None:
    """The observed durations and the timeouts calibrated from them, atomically."""
    data = {"durations": durations.to_json(), "timeouts": dict(timeouts)}
    atomic_write(run_dir / DURATIONS_NAME, (json.dumps(data, indent=1) + "\n").encode())
