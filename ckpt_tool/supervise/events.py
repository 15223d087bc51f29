"""The run's event log, ``RUN_DIR/events.jsonl``: one JSON object per line, appended and fsynced.

Written by ``ckpt run`` (starts, deaths, hangs, restarts), ``ckpt recover`` and the sbatch
script (job starts, requeues, the final state, through ``ckpt note``); read by ``ckpt status``
and ``ckpt history``. A torn last line (a crash mid-append) is skipped and reported by number.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ckpt_tool.core.index import parse_records
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.durable import append_line

EVENTS_NAME = "events.jsonl"


def note(run_dir: Path, event: str, **data: Any) -> dict[str, Any]:
    record = {"time": time.time(), "event": event, **data}
    run_dir.mkdir(parents=True, exist_ok=True)
    append_line(run_dir / EVENTS_NAME, json.dumps(record, sort_keys=True, default=str) + "\n")
    return record


def load_events(run_dir: Path) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
    """The run's events, and the numbers of the lines that are not events (torn, garbage).
    A run directory that is a file or not readable is a ``CkptError`` (exit 2), not a traceback."""
    try:
        with open(run_dir / EVENTS_NAME, encoding="utf-8", errors="replace") as f:
            return parse_records(f)
    except FileNotFoundError:
        if run_dir.exists() and not run_dir.is_dir():
            raise CkptError(
                f"{run_dir} is a file, not a run directory",
                "pass a checkpoint directory (its run/ is used) or a run directory holding events.jsonl",
                ExitCode.USAGE,
            ) from None
        return [], ()
    except NotADirectoryError:
        raise CkptError(
            f"{run_dir} is not a directory",
            "pass a checkpoint directory (its run/ is used) or a run directory holding events.jsonl",
            ExitCode.USAGE,
        ) from None
    except PermissionError:
        raise CkptError(
            f"permission denied reading {run_dir / EVENTS_NAME}",
            "run as the user who owns the run, or ask them to grant read access",
            ExitCode.USAGE,
        ) from None


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return load_events(run_dir)[0]
