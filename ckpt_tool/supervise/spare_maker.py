"""The spare maker: one process per node that imports torch and the checkpoint code once, then
forks a spare rank process (``supervise.warm_rank``) whenever ``ckpt run`` asks.

``python -u -m ckpt_tool.supervise.spare_maker POOL_DIR [MODULE...]``, started by ``ckpt run``'s
``WarmPool`` with a pipe on its standard input: a line ``fill N`` forks spares until N wait; end of
input (``ckpt run`` closing or gone) kills the spares nobody took and ends it once its children
are gone (1 s at most: ``ckpt run`` ends the ranks itself). A fork costs milliseconds and shares
the imported modules' memory (copy on write): making a spare after a restart takes no CPU from
the training (a spare that imported torch by itself took ~4 s of one core, measured, and on an
oversubscribed node that stalled the steps past the hang timeout). It is the spares' parent: it reaps them and writes each one's exit
status to ``POOL_DIR/<pid>.exit`` for its launcher (``supervise.handoff``).

Forking after ``import torch`` is safe as long as nothing has started CUDA or an OpenMP pool
(the spare maker runs no torch operation; import starts one idle native thread): the same
assumption as a DataLoader worker forked from a training process. A ``--warm-import`` module may
break it (a torch operation at import starts the intra-op pool: one more thread per core but one;
a ``.cuda()`` at import starts CUDA), so the maker counts its threads (psutil: native ones too) around
each such import and asks ``torch.cuda.is_initialized()``, and again before each fork
(``fork_hazard``). On a hazard it makes no spare from then on: it writes why, naming the module,
to ``POOL_DIR/<pid>.off`` (``ckpt run`` logs it as ``warm_off``; the ranks start cold) and goes on
reaping the spares it made. Measured with torch 2.13 (CPU, 2 cores): ``import torch`` and the
preloaded modules leave 2 threads, a 512x512 matmul after them 3; with ``OMP_NUM_THREADS=1`` the
matmul starts no thread (nothing to fear then, and nothing is reported).
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

import psutil

from ckpt_tool.core.handoff import READY, WARMING
from ckpt_tool.supervise.handoff import status_path
from ckpt_tool.supervise.warm_rank import PRELOAD, serve

OFF = ".off"  # POOL_DIR/<maker pid>.off: why the maker makes no more spares
REAP_EVERY_S = 0.02  # a launcher waits for its rank's exit status this long at most
# Python 3.12 warns at every fork of a process with several threads (torch's import starts one).
warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks.*", category=DeprecationWarning)


def fork_hazard(culprit: str, cuda_initialized: bool, threads_before: int, threads_after: int) -> str | None:
    """Why forking now would be unsafe (None: safe): ``culprit`` (what ran between the two thread
    counts, e.g. ``--warm-import mymod``) started CUDA, or more threads (an OpenMP/intra-op pool)."""
    if cuda_initialized:
        return (
            f"{culprit} started CUDA (torch.cuda.is_initialized() is true): a process forked from it "
            "cannot use the GPU, so no spare is made; leave it out of --warm-import or keep CUDA work out of its import"
        )
    if threads_after > threads_before:
        n = threads_after - threads_before
        return (
            f"{culprit} started {n} thread{'s' if n > 1 else ''} ({threads_before} -> {threads_after}: an OpenMP/intra-op "
            "pool, e.g. a torch operation at import): a fork of it can deadlock, so no spare is made; "
            "leave it out of --warm-import or run no torch operation at its import"
        )
    return None


def thread_count() -> int:
    """This process's threads, native ones included (an OpenMP pool is invisible to ``threading``)."""
    return psutil.Process().num_threads()


def cuda_started() -> bool:
    """True when torch is imported and CUDA is initialised in this process (a fork would be unsafe)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def import_all(preload: tuple[str, ...], extra: list[str]) -> tuple[int, str | None]:
    """Import the modules; the thread count after them and the first fork hazard one caused
    (the preloaded modules set the baseline: ``import torch`` starts one idle thread)."""
    for name in preload:
        importlib.import_module(name)
    threads = thread_count()
    hazard = fork_hazard("the preloaded modules", cuda_started(), threads, threads)
    for name in extra:
        if hazard is not None:
            break
        importlib.import_module(name)
        after = thread_count()
        hazard = fork_hazard(f"--warm-import {name}", cuda_started(), threads, after)
        threads = after
    return threads, hazard


def turn_off(pool: Path, why: str) -> None:
    """Say why no more spares come (``WarmPool`` reads it) and stop the launchers' wait for imports."""
    print(f"spare maker: {why}", file=sys.stderr, flush=True)
    partial = pool / f".{os.getpid()}{OFF}.partial"
    partial.write_text(why)
    os.replace(partial, pool / f"{os.getpid()}{OFF}")
    (pool / f"{os.getpid()}{WARMING}").unlink(missing_ok=True)


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
    """The pids of the spares in ``pool`` still waiting for a rank to take them."""
    return [int(p.stem) for p in pool.glob(f"*{READY}") if p.stem.isdigit()]


def main(argv: list[str]) -> NoReturn:
    """``python -m ckpt_tool.supervise.spare_maker POOL_DIR [MODULE...]``: import, then fork spares
    as ``fill N`` lines on standard input ask, until it closes."""
    pool, extra = Path(argv[0]), argv[1:]
    parent = os.getppid()
    # What a spare compares with the rank's environment: the one the imports ran under (some
    # imports add to it: torch._dynamo sets TORCHINDUCTOR_CACHE_DIR, as it would in a cold rank).
    spawned_with = dict(os.environ)
    try:
        baseline, hazard = import_all(PRELOAD, extra)
    except BaseException:  # noqa: BLE001 - in the pool's log; ckpt run then stops using spares
        traceback.print_exc()
        os._exit(3)
    if hazard is not None:
        turn_off(pool, hazard)
    while os.getppid() == parent:
        if select.select([0], [], [], REAP_EVERY_S)[0]:
            data = os.read(0, 4096)
            if not data:
                break  # ckpt run closed the pipe (or is gone)
            wanted = max((int(line.split()[1]) for line in data.split(b"\n") if line.strip()), default=0)
            if hazard is None and wanted > len(untaken(pool)):  # checked before each batch of forks
                hazard = fork_hazard("the spare maker, since its imports,", cuda_started(), baseline, thread_count())
                if hazard is not None:
                    turn_off(pool, hazard)
            if hazard is None:
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
