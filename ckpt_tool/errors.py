"""The one error type of ckpt-tool: a message that says what is wrong and a hint that says what to do.

The CLI turns it into a friendly message in one place (``ckpt_tool.cli.app``); library callers
can catch it and read ``.message``, ``.hint`` and ``.exit_code``. Its kinds (``DamageError``,
``MisfitError``/``NewerFormatError``, ``ConflictError``, ``PermissionDeniedError``,
``SaveFailedError``) are told apart by type, each with its exit code.
"""

from __future__ import annotations

import traceback


class ExitCode:
    """Exit codes of the ``ckpt`` commands (documented in README.md)."""

    OK = 0
    FAILED = 1  # a check failed (e.g. validate found damage) or the run failed
    USAGE = 2  # bad command line or bad input
    NOT_FOUND = 3  # no checkpoint directory / no valid checkpoint
    CONFLICT = 4  # the checkpoint does not fit the run (world size, format version)
    REQUEUE = 75  # `ckpt run`: stopped on request after committing a checkpoint: requeue me (EX_TEMPFAIL)
    CRASH_LOOP = 76  # `ckpt run`: failures in a row without progress; restarting would not help
    NODE_FAULT = 77  # `ckpt run`: a node keeps failing; the round ended so that the job can leave it behind
    # Saves failed (disk full, read-only, permissions, I/O errors): max_failed_saves in a row, or the
    # final save; the previous checkpoint is intact. Not restarted: the same disk fails the same way.
    SAVE_FAILED = 78
    # A wrong number (NaN, infinity) the replay from the checkpoint reproduced (the data or the model), a
    # second anomaly in one checkpoint interval, or anomaly mode "stop". Not restarted: it would recur.
    ANOMALY = 79
    # `ckpt verify`: nothing to verify, the checkpoint was saved without a probe (not damage: `ckpt validate` applies)
    NOTHING_TO_VERIFY = 5


# Failures a restart cannot fix: the same command line, configuration or checkpoint would fail
# again. `ckpt run` stops at once when a rank reports one (it does not restart it).
RESTART_CANNOT_HELP = frozenset({ExitCode.USAGE, ExitCode.NOT_FOUND, ExitCode.CONFLICT, ExitCode.SAVE_FAILED, ExitCode.ANOMALY})


def raised_at(exc: BaseException) -> str:
    """``FILE line N`` of the innermost frame of ``exc``'s traceback (where the user's or our code
    failed), or ``""`` when it has none."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename} line {frames[-1].lineno}" if frames else ""


class CkptError(Exception):
    """A failure the user can act on: ``message`` says what is wrong, ``hint`` what to do next.
    ``exit_code`` defaults to the kind's (``default_exit_code``: 1 here, each subclass its own)."""

    default_exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = self.default_exit_code if exit_code is None else exit_code

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class DamageError(CkptError):
    """The checkpoint's bytes are not what was committed (a hash, a size, a torn manifest):
    quarantine it and fall back to an older one. Exit 1. Every raiser of damage raises this
    kind; a plain ``CkptError`` with exit 1 is some other failure (a command, a write)."""


class ConflictError(CkptError):
    """Something else holds or changed what this wanted to change: the directory's lock or owner,
    a step that exists, a prune racing a commit. Not damage, not a disk failure. Exit 4."""

    default_exit_code = ExitCode.CONFLICT


class SaveFailedError(CkptError):
    """Saves failed (disk full, read-only, permissions, I/O errors); the previous checkpoint is
    intact. ``ckpt run`` does not restart it: the same disk fails the same way. Exit 78."""

    default_exit_code = ExitCode.SAVE_FAILED


class MisfitError(ConflictError):
    """A sound checkpoint that does not fit this run (world size, shapes, global batch): nothing
    is moved, an older checkpoint would not fit either. Exit 4 (a conflict with the run)."""


class NewerFormatError(MisfitError):
    """Written by a newer ckpt-tool (a format version this one cannot read): upgrade. Exit 4."""


class PermissionDeniedError(CkptError):
    """A file this user may not read or change: not damage, nothing judged or moved. Exit 2."""

    default_exit_code = ExitCode.USAGE
