"""Ending process trees. torchrun starts every worker in a session of its own, so signalling a
process group misses the ranks: collect the whole tree (by parent links) first, then signal it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil

RANKS_NAME = "ranks.json"


def ignore_usr1() -> None:
    """For the processes ``ckpt run`` starts: SLURM sends USR1 to every process of the step, and
    its default action kills (the ranks get the stop request on their channel instead)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def alive(pid: int) -> bool:
    """Running (a zombie is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tree(pids: list[int]) -> list[psutil.Process]:
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return procs


def _frozen(p: psutil.Process) -> bool:
    """A stopped process (SIGSTOP, a debugger) acts on SIGTERM only after a SIGCONT."""
    try:
        return p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.NoSuchProcess:
        return False


def kill_tree(pids: list[int], grace_s: float = 0.0) -> None:
    """SIGTERM every process and its descendants, SIGKILL what is left after ``grace_s``;
    with no grace, SIGKILL at once (a power cut). A stopped process gets SIGKILL at once: it
    could not act on the SIGTERM, and waiting the grace for it only delays the restart."""
    procs = _tree(pids)
    alive = procs
    if grace_s > 0:
        for p in procs:
            try:
                p.kill() if _frozen(p) else p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


def write_ranks(run_dir: Path, attempt: int, ranks: dict[int, int]) -> None:
    """``RUN_DIR/ranks.json``: the pid of each rank of this node's current attempt (a rank that
    started warm runs in a spare process, not below torchrun; ``ps`` shows its command)."""
    partial = run_dir / f"{RANKS_NAME}.partial"
    partial.write_text(json.dumps({"attempt": attempt, "ranks": {str(r): p for r, p in sorted(ranks.items())}}))
    os.replace(partial, run_dir / RANKS_NAME)


def read_ranks(run_dir: Path) -> dict[int, int]:
    """Rank -> pid from ``ranks.json``; {} when there is none (yet) or it cannot be read."""
    try:
        return {int(r): int(p) for r, p in json.loads((run_dir / RANKS_NAME).read_text())["ranks"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
