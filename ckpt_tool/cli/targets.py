"""What a command's arguments name, resolved for it: the checkpoint store ``DIR`` opens, the step
``--step`` (or LATEST) names, and the run directory (``--run-dir``, else ``CKPT_DIR/run``, the one
default every command uses)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_tool.core import layout
from ckpt_tool.errors import CkptError, ExitCode

if TYPE_CHECKING:  # the store is imported by the commands that open one (0.1 s: not for every `ckpt`)
    from ckpt_tool.store.store import CheckpointStore


def open_checkpoints(directory: Path) -> CheckpointStore:
    """An existing ckpt-tool checkpoint directory, or a clear error saying what was found."""
    from ckpt_tool.store.store import CheckpointStore

    store = CheckpointStore(directory)
    store.require_checkpoint_directory()
    return store


def resolve_step(store: CheckpointStore, step: int | None) -> int:
    """``--step N`` (exit 3 when no such step directory exists), else the step LATEST names (a
    LATEST that is missing or names no committed step: what is wrong and the repair command)."""
    if step is not None:
        if not 0 <= step <= layout.MAX_STEP:
            raise CkptError(
                f"--step {step} is not a step number", f"give a step from 0 to {layout.MAX_STEP} (see `ckpt list`)", ExitCode.USAGE
            )
        if not store.step_path(step).is_dir():
            raise store.no_such_step(step)
        return step
    return store.require_latest()


def checkpoint_at(target: Path, step: int | None) -> tuple[CheckpointStore, int]:
    """A checkpoint named by a step directory (``CKPT_DIR/step_00000010``), or by a checkpoint
    directory and ``step`` (default: the one LATEST names)."""
    named = layout.parse_step_dir_name(target.name)
    if named is not None and target.is_dir():
        if step is not None and step != named:
            raise CkptError(
                f"{target} is step {named}, but --step {step} was given",
                "name the checkpoint directory with --step, or the step directory alone",
                ExitCode.USAGE,
            )
        return open_checkpoints(target.parent), named
    store = open_checkpoints(target)
    return store, resolve_step(store, step)


def default_run_dir(ckpt_dir: Path) -> Path:
    """A checkpoint directory's run directory: ``CKPT_DIR/run`` (its events, scripts and job output)."""
    return ckpt_dir / layout.RUN_DIR_NAME


def run_dir_for(run_dir: Path | None, ckpt_dir: Path | None) -> Path:
    """``--run-dir``, else ``CKPT_DIR/run`` (from ``--ckpt-dir`` or the environment)."""
    if run_dir is not None:
        return run_dir
    ckpt = ckpt_dir or (Path(os.environ["CKPT_DIR"]) if os.environ.get("CKPT_DIR") else None)
    if ckpt is None:
        raise CkptError(
            "ckpt run needs to know where the run's events go",
            "give --ckpt-dir DIR (the checkpoint directory: events go to DIR/run, where `ckpt status DIR` looks) or --run-dir",
            ExitCode.USAGE,
        )
    return default_run_dir(ckpt)


def locate(target: Path, what: str = "", job_id_too: bool = True) -> tuple[Path, Path | None]:
    """(run directory, checkpoint directory or None) from either: a checkpoint directory's run
    directory is ``CKPT_DIR/run``; a run directory's checkpoint directory is its parent.
    ``what`` names the option the path came from (``--run-dir``) in the message."""
    named = f"{what} {target}" if what else str(target)
    pass_one = "pass the --ckpt-dir of the run (or its run/ directory)" + (", or a job id" if job_id_too else "")
    if not target.exists():
        raise CkptError(f"{named} does not exist", pass_one, ExitCode.NOT_FOUND)
    if not target.is_dir():
        raise CkptError(f"{named} is a file, not a checkpoint or run directory", pass_one, ExitCode.USAGE)
    if (target / "events.jsonl").exists() or (target.name == layout.RUN_DIR_NAME and not default_run_dir(target).exists()):
        parent = target.parent
        return target, parent if (parent / "LATEST").exists() or (parent / "index.jsonl").exists() else None
    return default_run_dir(target), target
