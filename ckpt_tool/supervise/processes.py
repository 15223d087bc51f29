"""Ending process trees. torchrun starts every worker in a session of its own, so signalling a
process group misses the ranks: collect the whole tree (by parent links) first, then signal it."""

from __future__ import annotations

import os
import signal
import time

import psutil

from ckpt_tool.supervise.stacks import STACKS_SIGNAL


def ignore_job_signals() -> None:
    """For the processes ``ckpt run`` starts: SLURM sends USR1 to every process of the step, and
    its default action kills (the ranks get the stop request on their channel instead); the stacks
    signal (``supervise.stacks.STACKS_SIGNAL``) is ignored until a rank arms its handler, so a
    request that comes first (or last, as the rank exits) cannot kill it."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(STACKS_SIGNAL, signal.SIG_IGN)


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
    left = procs
    if grace_s > 0:
        for p in procs:
            try:
                p.kill() if _frozen(p) else p.terminate()
            except psutil.NoSuchProcess:
                pass
        left = _wait_gone(procs, grace_s)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_gone(left, 10)


def end_launcher(pid: int, grace_s: float) -> None:
    """End a launcher (torchrun) and everything below it without letting it act: it is stopped
    first (no restart of the workers it would see dying, no traceback from its own SIGTERM
    handler after our clear message), what it started is ended as ``kill_tree`` does, then it
    gets SIGKILL."""
    try:
        root = psutil.Process(pid)
        root.suspend()
        below = [p.pid for p in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    kill_tree(below, grace_s)
    kill_tree([pid])


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process has exited; the ones still running at ``timeout``. An exited
    process counts as gone even before its parent reaps it: a zombie whose parent was killed
    waits for init, which took ~2 s here (psutil.wait_procs waited for that, measured)."""
    deadline = time.monotonic() + timeout
    left = procs
    while left:
        left = [p for p in left if not _ended(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)
    return left


def _ended(p: psutil.Process) -> bool:
    """Exited: reaped now if it is our child, or a zombie waiting for another parent."""
    try:
        p.wait(0)
        return True
    except psutil.TimeoutExpired:
        return not alive(p.pid)
    except (psutil.NoSuchProcess, ChildProcessError):
        return True


def started_at() -> float:
    """When this process started, epoch seconds, to its 10 ms clock tick on Linux (its start in
    ticks since boot against ``CLOCK_BOOTTIME``: psutil's ``create_time`` adds the boot time
    /proc/stat gives in whole seconds, up to 1 s off); elsewhere psutil's."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of proc(5): starttime, counted after the ")" of the command
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return psutil.Process().create_time()
