"""Ending process trees. torchrun starts every worker in a session of its own, so signalling a
process group misses the ranks: collect the whole tree (by parent links) first, then signal it."""

from __future__ import annotations

import psutil


def kill_tree(pids: list[int], grace_s: float = 0.0) -> None:
    """SIGTERM every process and its descendants, SIGKILL what is left after ``grace_s``;
    with no grace, SIGKILL at once (a power cut)."""
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    alive = procs
    if grace_s > 0:
        for p in procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
