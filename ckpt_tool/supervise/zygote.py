"""The spare maker: one process per node that imports torch and the checkpoint code once, then
forks a spare rank process (``supervise.warm_rank``) whenever ``ckpt run`` asks.

``python -u -m ckpt_tool.supervise.zygote POOL_DIR [MODULE...]``, started by ``ckpt run``'s
``WarmPool`` with a pipe on its standard input: a line ``fill N`` forks spares until N wait; end of
input (``ckpt run`` closing or gone) kills the spares nobody took and ends it once its children
are gone (1 s at most: ``ckpt run`` ends the ranks itself). A fork costs milliseconds and shares
the imported modules' memory (copy on write): making a spare after a restart takes no CPU from
the training (a spare that imported torch by itself took ~4 s of one core, measured, and on an
oversubscribed node that stalled the steps past the hang timeout). It is the spares' parent: it reaps them and writes each one's exit
status to ``POOL_DIR/<pid>.exit`` for its launcher (``supervise.handoff``).

Forking after ``import torch`` is safe as long as nothing has started CUDA or an OpenMP pool
(the spare maker runs no torch operation; import starts one idle native thread): the same
assumption as a DataLoader worker forked from a training process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import select
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import NoReturn

from ckpt_tool.core.handoff import READY, WARMING
from ckpt_tool.supervise.handoff import status_path
from ckpt_tool.supervise.warm_rank import PRELOAD, serve

REAP_EVERY_S = 0.02  # a launcher waits for its rank's exit status this long at most
# Python 3.12 warns at every fork of a process with several threads (torch's import starts one).
warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks.*", category=DeprecationWarning)


def fork_spare(pool: Path, spawned_with: dict[str, str]) -> tuple[int, int]:
    """Fork one spare (in the child, never return); its pid and a pipe that gets a byte once it
    listens for a launcher (or is closed when it dies first)."""
    maker = os.getpid()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        return pid, ready_r
    try:
        os.close(ready_r)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # not the maker's request pipe
        os.close(null)
        random.seed()  # also done by random's at-fork hook; numpy's global generator is not
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        serve(pool, maker, spawned_with, ready_w)
    finally:
        os._exit(1)


def wait_listening(ready: list[int], timeout: float) -> None:
    """Until every new spare listens (milliseconds): then it counts as ready for the watchdog."""
    deadline = time.monotonic() + timeout
    pending = list(ready)
    while pending and time.monotonic() < deadline:
        for fd in select.select(pending, [], [], max(0.0, deadline - time.monotonic()))[0]:
            os.read(fd, 1)
            pending.remove(fd)
    for fd in ready:
        os.close(fd)


def reap(pool: Path) -> int:
    """Publish the exit status of every child that ended; how many children are left."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            return 1
        code = os.waitstatus_to_exitcode(status)
        partial = pool / f".{pid}.exit.partial"
        partial.write_text(str(code))
        os.replace(partial, status_path(pool, pid))  # the launcher never reads half a number
        (pool / f"{pid}{READY}").unlink(missing_ok=True)


def untaken(pool: Path) -> list[int]:
    return [int(p.stem) for p in pool.glob(f"*{READY}") if p.stem.isdigit()]


def main(argv: list[str]) -> NoReturn:
    pool, extra = Path(argv[0]), argv[1:]
    parent = os.getppid()
    # What a spare compares with the rank's environment: the one the imports ran under (some
    # imports add to it: torch._dynamo sets TORCHINDUCTOR_CACHE_DIR, as it would in a cold rank).
    spawned_with = dict(os.environ)
    try:
        for name in (*PRELOAD, *extra):
            importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - in the pool's log; ckpt run then stops using spares
        traceback.print_exc()
        os._exit(3)
    while os.getppid() == parent:
        if select.select([0], [], [], REAP_EVERY_S)[0]:
            data = os.read(0, 4096)
            if not data:
                break  # ckpt run closed the pipe (or is gone)
            wanted = max((int(line.split()[1]) for line in data.split(b"\n") if line.strip()), default=0)
            wait_listening([fork_spare(pool, spawned_with)[1] for _ in range(wanted - len(untaken(pool)))], 5.0)
            (pool / f"{os.getpid()}{WARMING}").unlink(missing_ok=True)  # launchers stop waiting for imports
        reap(pool)
    for pid in untaken(pool):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while reap(pool) and time.monotonic() < deadline:  # ranks still running: ckpt run ends them
        time.sleep(REAP_EVERY_S)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
