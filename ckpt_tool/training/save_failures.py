"""What a failed save says and what the training does next. Pure: the facts in, a message out.

A save that fails on the disk (full, read-only, permission denied, an I/O error, a vanished
directory) removes its partial files, never moves LATEST, and is counted: the training goes on
with a loud warning and retries at the next save; ``max_failed_saves`` failures in a row stop it
with ``ExitCode.SAVE_FAILED`` (78), which ``ckpt run`` does not restart (the same disk would fail
the same way). Every OS error counts alike: the training cannot tell a lasting cause from one
that passes (a quota freed by another job, an NFS server back, a remount), a retry costs one
failed save, and the count bounds the training done without a checkpoint; the message names the
error so that the user can. A save with no later one to retry at (the final save at ``close()``,
the save of a stop request) stops at once when it fails.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from ckpt_tool.errors import CkptError, ExitCode, SaveFailedError


@dataclass(frozen=True)
class Needed:
    """The bytes a save needed, and where the figure comes from."""

    bytes: int
    source: str  # e.g. "the size of step 10", "this rank's 1.1 MB x 2 ranks"


@dataclass(frozen=True)
class SaveFailure:
    """The facts of one failed save, as a rank knows them."""

    step: int
    root: Path
    error_type: str  # the OS error's class name, or the failure's when no OS error is behind it
    error_text: str  # its first line
    errno: int | None = None
    filename: str | None = None
    free: int | None = None  # bytes free in ``root`` once the partial files were removed
    needed: Needed | None = None
    latest: int | None = None  # LATEST's step (intact), or None when nothing was committed yet


def human_bytes(n: int) -> str:
    """``2182750`` -> ``2.2 MB`` (decimal units, as ``df -H``), exact below 1 kB."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def describe(f: SaveFailure) -> CkptError:
    """The error of a failed save: the OS error (its errno name), the directory, for a full disk
    the bytes needed and free; the hint says what is intact and what to do."""
    kept = (
        f"the previous checkpoint (step {f.latest}) is intact, LATEST still names it, and the partial files were removed"
        if f.latest is not None
        else "no checkpoint was committed yet; the partial files were removed"
    )
    code = errno.errorcode.get(f.errno, "") if f.errno is not None else ""
    if f.errno == errno.ENOSPC:
        room = [f"{human_bytes(f.free)} free" if f.free is not None else ""]
        if f.needed is not None:
            room.append(f"this save needed about {human_bytes(f.needed.bytes)} ({f.needed.source})")
        space = "; ".join(r for r in room if r)
        return SaveFailedError(
            f"saving step {f.step} failed: no space left on device (ENOSPC) in {f.root}" + (f": {space}" if space else ""),
            f"free space there (`ckpt du {f.root}`, `ckpt prune {f.root} --keep-last 1`) or move the checkpoint directory; {kept}",
            ExitCode.SAVE_FAILED,
        )
    where = f" ({f.filename})" if f.filename else ""
    named = f"{f.error_type} [{code}]" if code else f.error_type
    return SaveFailedError(
        f"saving step {f.step} to {f.root} failed: {named}: {f.error_text}{where}",
        f"check that {f.root} is mounted, writable by this user and healthy; {kept}",
        ExitCode.SAVE_FAILED,
    )


@dataclass(frozen=True)
class FailedSavePolicy:
    """``max_failed`` failed saves in a row stop the training (0: never)."""

    max_failed: int

    def stops(self, in_a_row: int, last_chance: bool) -> bool:
        """Whether the ``in_a_row``-th failure in a row stops the training; ``last_chance``: no
        later save would retry (the final save, a stop request's save)."""
        if self.max_failed == 0:
            return False
        return last_chance or in_a_row >= self.max_failed

    def warning(self, error: CkptError, in_a_row: int) -> str:
        """The line logged when the training goes on without this checkpoint."""
        if self.max_failed == 0:
            limit = "max_failed_saves=0: the run never stops for a failed save"
        else:
            left = self.max_failed - in_a_row
            limit = (
                f"failed save {in_a_row} of {self.max_failed} in a row; "
                f"{left} more stop{'s' if left == 1 else ''} the run with exit code {ExitCode.SAVE_FAILED}"
            )
        return f"ckpt: WARNING: {error.message}. Training continues WITHOUT this checkpoint and retries at the next save ({limit}). {error.hint}"

    def stop_error(self, error: CkptError, in_a_row: int, last_chance: bool) -> CkptError:
        """The error that stops the training (exit code 78, not restarted by ``ckpt run``)."""
        if last_chance and in_a_row < self.max_failed:
            why = "no later save would retry it (the final save, or the save before a stop)"
        else:
            why = f"{in_a_row} failed saves in a row (max_failed_saves={self.max_failed})"
        return SaveFailedError(
            f"{error.message}; stopping: {why}",
            f"{error.hint}; fix the cause, then start the run again (`ckpt run` does not restart on exit code {ExitCode.SAVE_FAILED}: the same disk would fail the same way)",
            ExitCode.SAVE_FAILED,
        )
