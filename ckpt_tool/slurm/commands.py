"""The SLURM command boundary: sbatch, scontrol, squeue, sacct -c. One subprocess call each,
with errors that say which command failed and what to do."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.slurm.chain import parse_resize_script


@dataclass(frozen=True)
class JobState:
    """A job's state as SLURM tells it: state name (``RUNNING``, ``PENDING``...), requeue count and reason when
    the command gives them (None otherwise), and which command answered (``scontrol`` or ``sacct -c``)."""

    job_id: str
    state: str
    restarts: int | None
    reason: str | None
    source: str  # which command answered


def _run(argv: list[str], timeout: float = 30, cwd: str | None = None) -> str:
    if shutil.which(argv[0]) is None:
        raise CkptError(
            f"`{argv[0]}` is not on PATH: this machine has no SLURM client tools",
            "run on a login node of the cluster (or install slurm-client)",
            ExitCode.USAGE,
        )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
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


# --------------------------------------------------------------------------- the job chain's calls
# Asked from inside the batch job (slurm.job): each answers (a value, or False/None/"" when
# scontrol fails or is missing) instead of raising, since the chain decides what a failure means.


def available(name: str) -> bool:
    """Whether ``name`` (scontrol, srun) is on PATH here (a container may lack the SLURM tools)."""
    return shutil.which(name) is not None


def _answer(argv: list[str], timeout: float = 30, cwd: str | None = None) -> str | None:
    """stdout of ``argv``, or None when it is missing, fails or does not answer in time."""
    try:
        return _run(argv, timeout, cwd)
    except (CkptError, OSError, subprocess.TimeoutExpired):
        return None


def job_state_reason(job_id: str) -> tuple[str, str]:
    """JobState and Reason of ``scontrol show job -o JOB`` ("" for what it does not say)."""
    info = _fields(_answer(["scontrol", "show", "job", "-o", job_id]) or "")
    return info.get("JobState", ""), info.get("Reason", "")


def hostnames(nodelist: str) -> list[str]:
    """``scontrol show hostnames``: n[1-3] as n1, n2, n3 ([] when scontrol cannot say)."""
    if not nodelist:
        return []
    return (_answer(["scontrol", "show", "hostnames", nodelist]) or "").split()


def node_addr(node: str) -> str | None:
    """The node's NodeAddr (``scontrol show node``), where the rendezvous listens."""
    return _fields(_answer(["scontrol", "show", "node", node]) or "").get("NodeAddr") or None


def requeue(job_id: str) -> bool:
    """``scontrol requeue JOB``: whether SLURM took it."""
    return _answer(["scontrol", "requeue", job_id]) is not None


def exclude_nodes(job_id: str, nodes: str) -> bool:
    """``scontrol update JobId=JOB ExcNodeList=NODES``: takes only while the job is pending."""
    return _answer(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}"]) is not None


def shrink(job_id: str, keep: str) -> dict[str, str] | None:
    """``scontrol update JobId=JOB NodeList=KEEP``: the running job gives its other nodes back;
    returns the variables of the resize script scontrol writes (SLURM_JOB_NODELIST,
    SLURM_JOB_NUM_NODES... of the smaller job), or None when the update failed."""
    with tempfile.TemporaryDirectory(prefix="ckpt-resize-") as folder:
        if _answer(["scontrol", "update", f"JobId={job_id}", f"NodeList={keep}"], cwd=folder) is None:
            return None
        script = Path(folder) / f"slurm_job_{job_id}_resize.sh"
        try:
            return parse_resize_script(script.read_text())
        except OSError:
            return None
