"""One line per commit and per resume, from rank 0, on the ``ckpt_tool.progress`` logger.

Under plain torchrun nothing else says that a checkpoint was committed or where a run resumed
from. The lines go to that logger at INFO: when nothing handles it (no logging configured), the
manager gives it a handler that writes the bare line to stderr; a program that configured
logging gets the records through its own handlers. ``CheckpointConfig(quiet=True)`` emits none.
Under ``ckpt run`` they appear once (rank 0) in the run's log, next to ckpt run's own event
lines, which do not say where a checkpoint went or why a resume chose its step.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ckpt_tool.training.save_failures import human_bytes

progress = logging.getLogger("ckpt_tool.progress")
_OURS = "_ckpt_tool_stderr"  # marks the handler added here (added once per process)


def enable() -> None:
    """Make the progress lines visible: INFO on this logger (unless the program set a level),
    and a bare-line stderr handler when no handler would receive them."""
    if progress.level == logging.NOTSET:
        progress.setLevel(logging.INFO)
    if not progress.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.set_name(_OURS)
        progress.addHandler(handler)


def committed_line(step: int, path: Path, total_bytes: int, seconds: float) -> str:
    """``ckpt: checkpoint step N committed: PATH (SIZE, S s)``: the line after a commit (``seconds``: from
    the save call to the commit)."""
    return f"ckpt: checkpoint step {step} committed: {path} ({human_bytes(total_bytes)}, {seconds:.2f} s)"


def resumed_line(step: int, path: Path, skipped: list[str]) -> str:
    """``skipped``: why each newer candidate was passed over (damaged and quarantined, no manifest)."""
    why = "the newest valid checkpoint" if not skipped else "fell back past " + "; ".join(skipped)
    return f"ckpt: resumed from step {step} ({path}): {why}"


def fresh_line(root: Path) -> str:
    """``ckpt: no checkpoint in ROOT: starting from scratch``: the line of a resume that found nothing to resume from."""
    return f"ckpt: no checkpoint in {root}: starting from scratch"
