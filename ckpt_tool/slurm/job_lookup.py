"""Finding a job's run directory from its job id, for ``ckpt status JOBID`` / ``ckpt history JOBID``.

A job that ``ckpt submit`` (or ``ckpt_tool.submit``) sent runs a script that sets
``RUN_DIR=...`` and ``export CKPT_DIR=...`` (slurm_templates/train.sbatch.tmpl); SLURM keeps the
script while it knows the job (``scontrol write batch_script``), and ``scontrol show job``'s
``Command=`` names the script file, written as ``RUN_DIR/submit-*.sbatch``. Parsing is pure
(``locate_in``); ``find_job_run`` asks scontrol. A job that ended before SLURM's MinJobAge is
forgotten by scontrol (sacct keeps no path of ours): the caller names ``ckpt status CKPT_DIR``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ckpt_tool.errors import CkptError, ExitCode

_SCRIPT_NAME = re.compile(r"submit-[0-9-]+\.sbatch$")


class JobForgotten(CkptError):
    """scontrol no longer knows the job (it ended before MinJobAge): no script, no Command=."""


@dataclass(frozen=True)
class JobRun:
    """Where a job keeps its run: its run directory, its checkpoint directory, and how that was found."""

    job_id: str
    run_dir: Path
    ckpt_dir: Path | None
    found_in: str  # "the batch script" or "scontrol's Command="


def _assigned(script: str, name: str) -> str | None:
    """The value the script's last top-level ``NAME=value`` (or ``export NAME=value``) gives."""
    found = None
    for line in script.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words[:1] == ["export"]:
            words = words[1:]
        if len(words) == 1 and words[0].startswith(f"{name}="):
            found = words[0][len(name) + 1 :] or None
    return found


_PATH_FIELDS = ("Command", "WorkDir", "StdOut", "StdErr", "StdIn")


def show_job_field(shown: str, key: str) -> str | None:
    """A field of ``scontrol show job -dd``: one that holds a path (Command, WorkDir, StdOut...)
    is on a line of its own and runs to its end, spaces included; the others end at a space."""
    for line in shown.splitlines():
        text = line.strip()
        if key in _PATH_FIELDS:
            if text.startswith(f"{key}="):
                return text[len(key) + 1 :] or None
            continue
        for token in text.split():
            if token.startswith(f"{key}="):
                return token[len(key) + 1 :] or None
    return None


def locate_in(job_id: str, shown: str, script: str | None) -> JobRun | None:
    """The job's run (pure): from the batch script's ``RUN_DIR=`` / ``CKPT_DIR=``, else from
    ``Command=`` when it is a ``RUN_DIR/submit-*.sbatch`` that ``ckpt submit`` wrote. None: not
    a job of ckpt's (its script sets no RUN_DIR)."""
    if script:
        run_dir, ckpt_dir = _assigned(script, "RUN_DIR"), _assigned(script, "CKPT_DIR")
        if run_dir and "$" not in run_dir:
            return JobRun(job_id, Path(run_dir), Path(ckpt_dir) if ckpt_dir and "$" not in ckpt_dir else None, "the batch script")
    command = show_job_field(shown, "Command")
    if command and _SCRIPT_NAME.search(command):
        run_dir = Path(command).parent
        return JobRun(job_id, run_dir, None, "scontrol's Command=")
    return None


def find_job_run(job_id: str) -> JobRun:
    """The run of a job SLURM still knows; a ``CkptError`` that names the fallback otherwise."""
    from ckpt_tool.slurm.commands import job_record

    record = job_record(job_id)
    fallback = "pass the --ckpt-dir you gave `ckpt submit` instead: ckpt status CKPT_DIR (or ckpt history CKPT_DIR)"
    if record is None:
        raise JobForgotten(
            f"SLURM no longer knows job {job_id} (scontrol forgets a job MinJobAge after it ends; sacct keeps no run directory)",
            fallback,
            ExitCode.NOT_FOUND,
        )
    found = locate_in(job_id, *record)
    if found is None:
        command = show_job_field(record[0], "Command") or "its script"
        raise CkptError(f"job {job_id} was not submitted by `ckpt submit`: {command} sets no RUN_DIR", fallback, ExitCode.NOT_FOUND)
    if not found.run_dir.is_dir():
        raise CkptError(
            f"job {job_id}'s run directory {found.run_dir} (from {found.found_in}) is not there from this machine",
            "run this where the job's filesystem is mounted, or " + fallback,
            ExitCode.NOT_FOUND,
        )
    parent = found.run_dir.parent
    if found.ckpt_dir is None and ((parent / "LATEST").exists() or (parent / "index.jsonl").exists()):
        found = JobRun(found.job_id, found.run_dir, parent, found.found_in)
    return found
