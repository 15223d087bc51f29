"""``ckpt replay CKPT_DIR --from STEP [--steps K]``: run the training again from a checkpoint and
compare every rank's values with the run's record, bit for bit (``core.anomaly.compare_records``).

The run's checkpoint directory is never written: the replay runs on a copy that holds only step
STEP (its files hard-linked when the filesystem allows, else copied) in a work directory, with its
own run directory. The command is the one ``ckpt run`` recorded (``RUN_DIR/command.json``), run
under torchrun on this machine at the checkpoint's world size, in the directory it ran in; its
``--ckpt-dir`` and any argument naming a path under the run's checkpoint or run directory point at
the copy instead; ``CKPT_DIR``/``CKPT_RUN_DIR`` name the copy, ``CKPT_REPLAY_FROM``/``_UNTIL``
make the manager load step STEP and nothing else and stop after step STEP+K
(``training.manager``), ``CKPT_LOCAL_DIR`` an empty fast tier.
Or the caller's own command (``-- COMMAND``). Other paths the command writes (a log of its own)
are written again: the report names them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpt_tool.core.anomaly import RecordComparison, compare_records
from ckpt_tool.core.torchrun_output import ranks_error
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.supervise import run_dir as rd
from ckpt_tool.training.manager import ENV_REPLAY_FROM, ENV_REPLAY_UNTIL

DIR_FLAGS = ("--ckpt-dir", "--checkpoint-dir")  # the script's own name for its checkpoint directory


@dataclass(frozen=True)
class Replay:
    """What ``ckpt replay`` ran and found: the comparison, the command, where its output and files
    are (``work``: kept with ``--keep``, else removed), and the command's paths outside the copy."""

    comparison: RecordComparison
    command: tuple[str, ...]
    cwd: str
    world_size: int
    work: Path
    log: Path
    outside: tuple[str, ...]


def copy_step(store: CheckpointStore, step: int, dest: Path) -> CheckpointStore:
    """A checkpoint directory at ``dest`` holding ``step`` alone, its files hard-linked (or copied
    across filesystems) and LATEST on it. The original is only read."""
    dest.mkdir(parents=True)
    copy = CheckpointStore(dest)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(store.step_path(step), copy.step_path(step), copy_function=link)
    with copy.changing():
        copy.write_latest_locked(step)
    return copy


def pointed_at_copy(command: Sequence[str], ckpt_dir: Path, run_dir: Path, copy_dir: Path, copy_run: Path) -> tuple[list[str], list[str]]:
    """``command`` with its checkpoint directory (``--ckpt-dir X``, ``--ckpt-dir=X``, any argument
    under the run's checkpoint or run directory) pointed at the copy; and the absolute paths it
    names elsewhere (what the replay writes again)."""
    places = [(run_dir.resolve(), copy_run), (ckpt_dir.resolve(), copy_dir)]  # the run directory may be inside CKPT_DIR: first

    def moved(value: str) -> str | None:
        if not value.startswith("/"):
            return None
        path = Path(value).resolve()
        for old, new in places:
            if path == old or old in path.parents:
                return str(new / path.relative_to(old))
        return None

    out, outside = [], []
    after_flag = False
    for arg in command:
        flag, eq, value = arg.partition("=")
        if after_flag:
            out.append(str(copy_dir))
        elif eq and flag in DIR_FLAGS:
            out.append(f"{flag}={copy_dir}")
        elif (m := moved(arg)) is not None:
            out.append(m)
        else:
            out.append(arg)
            if arg.startswith("/") and not arg.startswith(sys.prefix):
                outside.append(arg)
        after_flag = arg in DIR_FLAGS
    return out, outside


def _check_recorded(recorded: dict, run_dir: Path) -> None:
    """``command.json`` as ckpt run writes it (a list of words, a directory, a count), or a ``CkptError``."""
    command, cwd, nproc = recorded.get("command"), recorded.get("cwd"), recorded.get("nproc_per_node")
    if not (
        isinstance(command, list)
        and command
        and all(isinstance(w, str) for w in command)
        and isinstance(cwd, str)
        and isinstance(nproc, int)
    ):
        raise CkptError(
            f"{run_dir / 'command.json'} is not what ckpt run writes (a list of words, the directory it ran in, the processes per node)",
            "give the command instead: ckpt replay CKPT_DIR --from STEP -- train.py ARGS",
            ExitCode.USAGE,
        )


def recorded_values(run_dir: Path, ranks: int, after: int, until: int) -> dict[int, dict[int, dict[str, float]]]:
    """Each rank's recorded values of the steps after ``after`` up to ``until`` (the newest of each)."""
    return {r: rd.recent_metrics(run_dir, r, after, until) for r in range(ranks)}


def replay(
    store: CheckpointStore,
    step: int,
    steps: int,
    run_dir: Path,
    command: Sequence[str] = (),
    work: Path | None = None,
    timeout_s: float | None = None,
) -> Replay:
    """Replay ``steps`` steps from checkpoint ``step`` of ``store`` (see the module).

    Raises:
        CkptError: no recorded command and none given (exit 2); the step is not valid (exit 3,
            through the store); the replayed training failed (exit 1, its last lines).
    """
    if steps < 1:
        raise CkptError(f"--steps {steps}: replay at least one step", "e.g. --steps 5", ExitCode.USAGE)
    manifest = store.read_manifest(step)  # a committed step, or a clear error
    recorded = rd.read_command(run_dir)
    if not command and recorded is None:
        raise CkptError(
            f"{run_dir} has no recorded training command (command.json: written by ckpt run since this version)",
            "if ckpt run had another --run-dir, give it here too; else give the command: "
            "ckpt replay CKPT_DIR --from STEP -- train.py ARGS (or -- -m package.module ARGS)",
            ExitCode.USAGE,
        )
    if not command:
        assert recorded is not None
        _check_recorded(recorded, run_dir)
    work = Path(tempfile.mkdtemp(prefix="ckpt-replay-")) if work is None else work
    if work.exists() and any(work.iterdir()):
        raise CkptError(
            f"--work {work} is not empty", "give a new or empty directory (the replay's copy and output go there)", ExitCode.USAGE
        )
    copy_dir, copy_run, log = work / "ckpt", work / "run", work / "replay.log"
    copy_step(store, step, copy_dir)
    if command:
        argv, outside, cwd = list(command), [], os.getcwd()
    else:
        assert recorded is not None
        argv, outside = pointed_at_copy(recorded["command"], store.root, run_dir, copy_dir, copy_run)
        cwd = str(recorded.get("cwd") or os.getcwd())
    until = step + steps
    env = {
        **os.environ, "CKPT_DIR": str(copy_dir), "CKPT_RUN_DIR": str(copy_run), ENV_REPLAY_FROM: str(step), ENV_REPLAY_UNTIL: str(until),
        "CKPT_LOCAL_DIR": str(work / "local"), "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={manifest.world_size}", *argv]
    with open(log, "wb") as out:
        try:
            proc = subprocess.run(torchrun, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise CkptError(f"the replay did not finish in {timeout_s} s", f"see its output: {log}", ExitCode.FAILED) from None
    if proc.returncode != 0:
        raise CkptError(
            f"the replayed training failed (exit {proc.returncode}): {ranks_error(log.read_text(errors='replace'))[:600]}",
            f"see its whole output: {log}; the command ran in {cwd}: {' '.join(torchrun)}",
            ExitCode.FAILED,
        )
    ranks = manifest.world_size
    comparison = compare_records(
        recorded_values(run_dir, ranks, step, until), recorded_values(copy_run, ranks, step, until), step + 1, until
    )
    return Replay(comparison, tuple(argv), cwd, ranks, work, log, tuple(outside))
