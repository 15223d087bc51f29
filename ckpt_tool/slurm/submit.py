"""Submitting the requeue chain: one job spec, one rendered script, from the CLI or from Python.

``prepare`` builds the frozen ``JobSpec`` (defaults from ``ckpt.toml`` / ``[tool.ckpt]``, signal
lead from the last measured checkpoint time) and renders the script; ``ckpt submit`` writes it
next to the checkpoints and calls sbatch. ``submit`` is the Python API: it submits the same
script through a submitit executor and returns submitit's job object (job id, cancel, state).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import submitit

from ckpt_tool import __version__, config
from ckpt_tool.core.layout import RUN_DIR_NAME
from ckpt_tool.core.render import JobSpec, option_value, render, signal_lead
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.durable import atomic_write
from ckpt_tool.supervise.durations import read_durations
from ckpt_tool.supervise.events import note


def template() -> str:
    return (files("ckpt_tool.slurm_templates") / "train.sbatch.tmpl").read_text()


def measured_checkpoint_seconds(run_dir: Path) -> float | None:
    """The longest checkpoint phase `ckpt run` observed in this run directory, if any."""
    durations = read_durations(run_dir)
    samples = durations.durations.get("checkpoint") if durations is not None else None
    return max(samples) if samples else None


def check_ckpt_dir_agrees(command: Sequence[str], ckpt_dir: Path) -> None:
    """The training command's own ``--ckpt-dir``, when it has one, must be the job's: the chain
    (recover, status, requeue) watches one directory, the training must write there."""
    given = option_value(command, "--ckpt-dir")
    if given is not None and Path(given).absolute() != ckpt_dir.absolute():
        raise CkptError(
            f"the training command writes checkpoints to {given}, but --ckpt-dir is {ckpt_dir}",
            "give both the same directory, or leave --ckpt-dir out of the training command: the job exports CKPT_DIR (the reference recipe reads it)",
            ExitCode.USAGE,
        )


def prepare(
    command: Sequence[str], ckpt_dir: Path, run_dir: Path | None = None, signal_lead_s: int | None = None, **options: Any
) -> tuple[JobSpec, str]:
    """The job spec and its script; ``options`` are ``JobSpec`` fields. Missing SLURM settings
    come from ``ckpt.toml`` / ``[tool.ckpt]``; each node's task gets at least one CPU per rank."""
    check_ckpt_dir_agrees(command, ckpt_dir)
    ckpt_dir = ckpt_dir.absolute()
    run_dir = (run_dir or ckpt_dir / RUN_DIR_NAME).absolute()
    for key in ("time", "partition", "account", "qos", "constraint", "mem", "cpus_per_task"):
        if options.get(key) is None:
            options[key] = config.default(key)
    if options.get("cpus_per_task") is None:
        options["cpus_per_task"] = options.get("nproc_per_node", 1)  # one `ckpt run` task per node holds all its ranks
    spec = JobSpec(
        command=tuple(command),
        ckpt_dir=str(ckpt_dir),
        run_dir=str(run_dir),
        ckpt=(sys.executable, "-m", "ckpt_tool.cli.main"),
        signal_lead_s=signal_lead_s or signal_lead(measured_checkpoint_seconds(run_dir)),
        version=__version__,
        created=datetime.datetime.now().isoformat(timespec="seconds"),
        **options,
    )
    return spec, render(spec, template())


def write_script(spec: JobSpec, script: str) -> Path:
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"submit-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}.sbatch"
    atomic_write(path, script.encode(), mode=0o755)
    return path


class ChainExecutor(submitit.SlurmExecutor):
    """A submitit executor whose submission file is ckpt-tool's chain script (trap, recover,
    one `ckpt run` per node, requeue) rather than submitit's pickled-function runner."""

    def __init__(self, folder: Path, script: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder=folder)
        self._script = script

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def submit_chain(self) -> submitit.Job:
        return self._submit_command("ckpt-tool chain")


def submit(command: Sequence[str], ckpt_dir: Path | str, **options: Any) -> submitit.Job:
    """Submit the requeue chain from Python, the same script ``ckpt submit`` writes.

    Args:
        command: the training script and its arguments (or ``["-m", "module", ...]``).
        ckpt_dir: the checkpoint directory (exported to the job as ``CKPT_DIR``).
        options: ``JobSpec`` fields, as the options of ``ckpt submit`` (``nodes``,
            ``nproc_per_node``, ``gpus_per_node``, ``cpus_per_task``, ``mem``, ``time``,
            ``partition``, ``max_requeues``, ``env``...).

    Returns:
        submitit's ``Job`` (``job_id``, ``state``, ``cancel()``).

    Raises:
        CkptError: a bad option (exit 2), e.g. a SLURM value with characters SLURM would misread,
            or a training command whose ``--ckpt-dir`` names another directory.
        submitit's errors when ``sbatch`` fails.
    """
    spec, script = prepare(command, Path(ckpt_dir), **options)
    write_script(spec, script)
    job = ChainExecutor(Path(spec.run_dir) / "submitit", script).submit_chain()
    note(Path(spec.run_dir), "submitted", job_id=job.job_id, via="python api (submitit)")
    return job


def dry_run(spec: JobSpec, script: str) -> str:
    """The script as `--dry-run` prints it: no timestamp, so it is reproducible."""
    return render(replace(spec, created="DRY-RUN"), template())
