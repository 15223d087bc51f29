"""Submitting the requeue chain: one job spec, one rendered script, from the CLI or from Python.

``prepare`` builds the frozen ``JobSpec`` (defaults from ``ckpt.toml`` / ``[tool.ckpt]``, signal
lead from the last measured checkpoint time) and renders the script; ``ckpt submit`` writes it
next to the checkpoints and calls sbatch. ``submit`` is the Python API: it submits the same
script through a submitit executor and returns submitit's job object (job id, cancel, state).
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import submitit

from ckpt_tool import __version__, config
from ckpt_tool.core.layout import RUN_DIR_NAME
from ckpt_tool.core.notify import DEFAULT_TIMEOUT_S, NotifyConfig, notify_env, parse_events
from ckpt_tool.core.render import JobSpec, option_value, render, signal_lead
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.durable import atomic_write
from ckpt_tool.supervise.run_dir import note, read_timeouts


def template() -> str:
    """The packaged sbatch template's text (``slurm_templates/train.sbatch.tmpl``)."""
    return (files("ckpt_tool.slurm_templates") / "train.sbatch.tmpl").read_text()


def measured_checkpoint_seconds(run_dir: Path) -> float | None:
    """The longest checkpoint phase `ckpt run` observed in this run directory, if any."""
    durations = read_timeouts(run_dir)
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


@contextmanager
def _path_of_python_m(workdir: Path, extra: Sequence[str]) -> Iterator[None]:
    """``sys.path`` as ``python -m`` started in ``workdir`` has it: that directory first."""
    saved = sys.path[:]
    sys.path[:] = [str(workdir), *(str(workdir / p) for p in extra), *saved]
    try:
        yield
    finally:
        sys.path[:] = saved


def _spec(fullname: str, path: Sequence[str] | None) -> Any:
    """What the import system's finders (``sys.meta_path``: built-ins, frozen, the path finder,
    setuptools' editable finder...) return for ``fullname``, its parent package's ``__path__``
    given; nothing is imported or executed."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path) if find is not None else None
        if spec is not None:
            return spec
    return None


def missing_module(name: str, workdir: Path, extra_path: Sequence[str] = (), run: bool = True) -> str | None:
    """The first part of ``name`` (``a``, ``a.b``...) that ``python -m name``, started by this
    Python in ``workdir``, would not find, or ``None`` when it finds it (a package needs its
    ``__main__``). Asks the same finders as the import system, walking each package's search
    locations instead of importing it: no package's ``__init__`` runs (one that rewrites its
    ``__path__`` at import is not followed). ``extra_path``: entries of the job's own PYTHONPATH;
    ``run=False``: importable is enough (a package needs no ``__main__``)."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return name
    path: Sequence[str] | None = None
    with _path_of_python_m(workdir, extra_path):
        for i in range(len(parts)):
            fullname = ".".join(parts[: i + 1])
            spec = _spec(fullname, path)
            if spec is None:
                return fullname
            path = spec.submodule_search_locations
            if path is None and i < len(parts) - 1:  # a module has no submodules
                return ".".join(parts[: i + 2])
        if run and path is not None and _spec(f"{name}.__main__", path) is None:  # python -m runs a package's __main__
            return f"{name}.__main__"
    return None


def check_training_command(command: Sequence[str], workdir: Path, env: Sequence[tuple[str, str]] = (), where: str = "") -> None:
    """A mistyped module or script fails every rank at once (and torchrun restarts them all
    ``--max-restarts`` times, or a job fails only after its queue wait): refuse it first, looked
    up as the ranks' Python will, from the directory the ranks start in (``workdir``)."""
    from_where = where or f"run from {workdir}"
    extra = [p for key, value in env if key == "PYTHONPATH" for p in value.split(os.pathsep) if p]
    if len(command) > 1 and command[0] == "-m":
        missing = missing_module(command[1], workdir, extra)
        if missing is not None and missing.endswith(".__main__"):
            raise CkptError(
                f"-m {command[1]}: a package without a __main__ module, which python -m cannot run ({from_where})",
                f"name the module to run inside it, e.g. -m {command[1]}.train",
                ExitCode.USAGE,
            )
        if missing is not None:
            raise CkptError(
                f"no module {missing!r} for this Python ({sys.executable}), {from_where}",
                "check the name after -m, install its package in this Python, or start from the directory the module is in (or put it on PYTHONPATH)",
                ExitCode.USAGE,
            )
    elif command and not command[0].startswith("-") and not (workdir / command[0]).is_file():
        raise CkptError(
            f"no training script {command[0]} ({from_where})",
            "give the script's path, relative to that directory or absolute, e.g. -- train.py --steps 100",
            ExitCode.USAGE,
        )


def job_workdir(extra_sbatch: Sequence[str], cwd: Path | None = None) -> Path:
    """The directory the job starts in: ``--chdir``/``-D`` of an extra ``#SBATCH`` line, else the
    directory sbatch is called from (its default)."""
    cwd = cwd or Path.cwd()
    found = None
    for line in extra_sbatch:
        words = line.removeprefix("#SBATCH").split()
        for i, word in enumerate(words):
            if word.startswith("--chdir="):
                found = word.split("=", 1)[1]
            elif word in ("--chdir", "-D") and i + 1 < len(words):
                found = words[i + 1]
            elif word.startswith("-D") and len(word) > 2:
                found = word[2:]
    return cwd / found if found else cwd


def check_job_command(spec: JobSpec) -> None:
    """The job's training command must be found where the job starts, by this Python (the job's)."""
    workdir = job_workdir(spec.extra_sbatch)
    check_training_command(spec.command, workdir, spec.env, where=f"where the job starts: {workdir}")


def prepare(
    command: Sequence[str],
    ckpt_dir: Path,
    run_dir: Path | None = None,
    signal_lead_s: int | None = None,
    *,
    check_command: bool = True,
    notify: str | None = None,
    notify_on: Sequence[str] = (),
    notify_timeout_s: float = DEFAULT_TIMEOUT_S,
    **options: Any,
) -> tuple[JobSpec, str]:
    """The job spec and its script; ``options`` are ``JobSpec`` fields. Missing SLURM settings
    come from ``ckpt.toml`` / ``[tool.ckpt]``; each node's task gets at least one CPU per rank.
    A training command the job would not find is refused (``check_command``; see ``check_job_command``).
    ``notify``: a shell command ``ckpt job`` runs with each event's JSON on stdin (``notify_on``:
    which events, default ``core.notify.NOTIFY_EVENTS``), exported to it as ``CKPT_NOTIFY...``
    (see ``notify_config``)."""
    check_ckpt_dir_agrees(command, ckpt_dir)
    wanted = notify_config(notify, notify_on, notify_timeout_s)
    if wanted is not None:
        options["env"] = notify_env(tuple(options.get("env") or ()), wanted)
    ckpt_dir = ckpt_dir.absolute()
    run_dir = (run_dir or ckpt_dir / RUN_DIR_NAME).absolute()
    for key in ("time", "partition", "account", "qos", "constraint", "mem", "cpus_per_task", "spares", "node_check"):
        if options.get(key) is None:
            options[key] = config.default(key)
    options["spares"] = options.get("spares") or 0
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
    if check_command:
        check_job_command(spec)
    return spec, render(spec, template())


def notify_config(command: str | None, events: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> NotifyConfig | None:
    """``--notify CMD [--notify-on E,...] [--notify-timeout S]`` checked (``CkptError``, exit 2: an
    empty or multi-line command, an event that cannot notify, or --notify-on/--notify-timeout without
    --notify); None without a command."""
    if command is None:
        if events or timeout_s != DEFAULT_TIMEOUT_S:
            raise CkptError(
                "--notify-on and --notify-timeout need --notify CMD",
                "e.g. --notify 'cat >> ~/job-events.jsonl' --notify-on job_finished,job_failed",
                ExitCode.USAGE,
            )
        return None
    return NotifyConfig(command, parse_events(events), timeout_s)


def write_script(spec: JobSpec, script: str) -> Path:
    """Write ``script`` (mode 0755, atomically) as ``RUN_DIR/submit-YYYYmmdd-HHMMSS-ffffff.sbatch``, creating
    the run directory; returns its path. Raises ``OSError`` from the filesystem."""
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
        """Submit the chain script through ``sbatch``; returns submitit's job (its ``job_id`` is SLURM's)."""
        return self._submit_command("ckpt-tool chain")


def submit(command: Sequence[str], ckpt_dir: Path | str, **options: Any) -> submitit.Job:
    """Submit the requeue chain from Python, the same script ``ckpt submit`` writes.

    Args:
        command: the training script and its arguments (or ``["-m", "module", ...]``).
        ckpt_dir: the checkpoint directory (exported to the job as ``CKPT_DIR``).
        options: ``JobSpec`` fields, as the options of ``ckpt submit`` (``nodes``,
            ``nproc_per_node``, ``gpus_per_node``, ``cpus_per_task``, ``mem``, ``time``,
            ``partition``, ``max_requeues``, ``env``...), and ``notify`` (a shell command run with
            each event's JSON on stdin), ``notify_on``, ``notify_timeout_s``.

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
