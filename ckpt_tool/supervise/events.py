"""The run's event log, ``RUN_DIR/events.jsonl``: kept as a name for its callers; the one reader
and writer is ``supervise.run_dir`` (``note``, ``load_events``, ``read_events``), the catalog of
every event and its fields ``core.run_catalog``."""

from __future__ import annotations

from ckpt_tool.supervise.run_dir import EVENTS_NAME, load_events, note, read_events

__all__ = ["EVENTS_NAME", "load_events", "note", "read_events"]
