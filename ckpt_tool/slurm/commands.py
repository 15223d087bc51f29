"""The SLURM command boundary: sbatch, scontrol, squeue, sacct -c. One subprocess call each,
with errors that say which command failed and what to do."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ckpt_tool.errors import CkptError, ExitCode


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    restarts: int | None
    reason: str | None
    source: str  # which command answered


def _run(argv: list[str], timeout: float = 30) -> str:
    if shutil.which(argv[0]) is None:
        raise CkptError(
            f"`{argv[0]}` is not on PATH: this machine has no SLURM client tools",
            "run on a login node of the cluster (or install slurm-client)",
            ExitCode.USAGE,
        )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise CkptError(
            f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}",
            "check the options and the cluster's state (sinfo)",
            ExitCode.FAILED,
        )
    return proc.stdout


def sbatch(script: str) -> str:
    """Submit; returns the job id."""
    out = _run(["sbatch", "--parsable", script]).strip()
    return out.split(";")[0]


def _fields(text: str) -> dict[str, str]:
    out = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def job_state(job_id: str) -> JobState | None:
    """scontrol while SLURM remembers the job (MinJobAge), else the last `sacct -c` row."""
    try:
        info = _fields(_run(["scontrol", "show", "job", job_id]))
        if info.get("JobState"):
            restarts = info.get("Restarts")
            return JobState(
                job_id, info["JobState"], int(restarts) if restarts and restarts.isdigit() else None, info.get("Reason"), "scontrol"
            )
    except CkptError:
        pass
    try:
        rows = [
            line.split("|") for line in _run(["sacct", "-c", "-j", job_id, "-n", "-P", "-o", "JobID,State"]).splitlines() if line.strip()
        ]
    except CkptError:
        return None
    if not rows:
        return None
    return JobState(job_id, rows[-1][1], len(rows) - 1, None, "sacct -c")


def job_record(job_id: str) -> tuple[str, str | None] | None:
    """What scontrol still holds of a job: ``scontrol show job -dd`` and its batch script
    (``scontrol write batch_script JOB -``; None when it cannot give it), or None when scontrol
    no longer knows the job (ended before MinJobAge) or does not answer."""
    try:
        shown = _run(["scontrol", "show", "job", "-dd", job_id])
    except CkptError:
        return None
    try:
        script: str | None = _run(["scontrol", "write", "batch_script", job_id, "-"])
    except CkptError:
        script = None
    return shown, script
