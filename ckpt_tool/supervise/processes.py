"""Ending process trees. torchrun starts every worker in a session of its own, so signalling a
process group misses the ranks: collect the whole tree (by parent links) first, then signal it."""

from __future__ import annotations

import psutil


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
