"""The phase durations ``ckpt run`` observed, ``RUN_DIR/timeouts.json``: kept as a name for its
callers; the one reader and writer is ``supervise.run_dir`` (``read_timeouts``, ``write_timeouts``)."""

from __future__ import annotations

from ckpt_tool.core.run_catalog import TIMEOUTS_NAME as DURATIONS_NAME
from ckpt_tool.supervise.run_dir import read_timeouts as read_durations
from ckpt_tool.supervise.run_dir import write_timeouts as write_durations

__all__ = ["DURATIONS_NAME", "read_durations", "write_durations"]
