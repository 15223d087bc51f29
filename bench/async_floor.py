"""Figure 2c: the floor of "compute lost while an async save runs" on this machine.

How: one process, the ~0.5 GB model of figure 2b (--quick ~64 MB), the same compute loop of
small matmuls (torch's default intra-op threads: every core of the machine). Each part of a save
that no asynchronous checkpointer can skip runs alone, once synchronously (timed) and once in a
background thread while the loop computes (compute lost = the thread's seconds - matmuls done
meanwhile / the loop's rate alone, measured for 1 s before). Parts, in an order rotated between
repetitions:

* staging: the copy of the state into a second buffer (the snapshot an async save needs so that
  training may change the parameters while the files are written);
* write: the staged bytes written into one new file (``os.write`` of 8 MiB pieces, then
  ``fsync``): the kernel's copy into the page cache, the writeback, the device;
* write O_DIRECT: the same through a page-aligned 8 MiB buffer with ``O_DIRECT`` (no page cache:
  the lever that skips the kernel's copy and writeback);
* hash: xxh3-64 over the staged bytes (ckpt_tool hashes every chunk as it is written).

Reference: a sync ``dcp.save`` of the same state (4 threads, fsync), as in figure 2b. The floor
of an async save's compute lost is staging + write + hash lost; over the sync save it bounds from
below what any thread or process checkpointer on these cores can reach (#15's target is 0.25).
"""

from __future__ import annotations

import mmap
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from common import GB, Result, Row, Stats

PIECE = 8 << 20
PARTS = ("staging", "write", "write_odirect", "hash")
TARGET = 0.25  # compute lost per background save / sync save (#15)


def write_odirect(path: Path, view: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    aligned = mmap.mmap(-1, PIECE)  # anonymous maps are page-aligned, as O_DIRECT requires
    try:
        for offset in range(0, len(view), PIECE):
            piece = view[offset : offset + PIECE]
            aligned[: len(piece)] = piece
            os.write(fd, aligned)  # the tail is padded to a whole piece (this file is thrown away)
        os.fsync(fd)
    finally:
        os.close(fd)
        aligned.close()


def measure(work: Path, state_bytes: float, reps: int) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    import xxhash
    from torch.distributed.checkpoint import FileSystemWriter

    state = common.build_model(state_bytes).state_dict()
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    staged = torch.empty_like(flat)
    view = memoryview(staged.numpy()).cast("B")
    loop = common.MatmulLoop()
    rate = loop.rate

    def hash_all() -> None:
        h = xxhash.xxh3_64()
        for offset in range(0, len(view), PIECE):
            h.update(view[offset : offset + PIECE])

    path = work / "part.bin"
    parts: dict[str, Callable[[], Any]] = {
        "staging": lambda: staged.copy_(flat),
        "write": lambda: common.raw_write(path, [view[o : o + PIECE] for o in range(0, len(view), PIECE)]),
        "write_odirect": lambda: write_odirect(path, view),
        "hash": hash_all,
    }

    def background(fn: Callable[[], Any]) -> tuple[float, float]:
        alone = rate(1.0)
        finished = threading.Event()
        seconds: list[float] = []

        def run() -> None:
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
            finished.set()

        thread = threading.Thread(target=run)
        thread.start()
        done = loop.matmuls_until(finished.is_set, 0.05)
        thread.join()
        return seconds[0], seconds[0] - done / alone

    rate(1.0)  # warm-up
    sync_saves = []
    for i in range(2):
        common.settle()
        writer = FileSystemWriter(work / f"sync{i}", single_file_per_rank=True, sync_files=True, thread_count=4, overwrite=True)
        sync_saves.append(common.timed(lambda w=writer: dcp.save(state, storage_writer=w, no_dist=True))[0])
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in PARTS}
    for rep in range(reps):
        for part in PARTS[rep % len(PARTS) :] + PARTS[: rep % len(PARTS)]:
            common.settle()
            sync, _ = common.timed(parts[part])
            path.unlink(missing_ok=True)
            common.settle()
            upload, lost = background(parts[part])
            path.unlink(missing_ok=True)
            runs[part].append({"sync": sync, "background": upload, "lost": lost})
    return {"nbytes": len(view), "sync_save": sync_saves, "runs": runs, "threads": torch.get_num_threads()}


def report(m: dict[str, Any]) -> Result:
    save = Stats.of(m["sync_save"])
    result = Result("2c", f"The floor of an async save's compute lost on this machine ({m['nbytes'] / GB:.2f} GB, one part at a time)")
    lost = {p: statistics.median(r["lost"] for r in m["runs"][p]) for p in PARTS}
    for part in PARTS:
        runs = m["runs"][part]
        own = statistics.median(r["lost"] / r["sync"] for r in runs)
        result.rows.append(
            Row(
                f"compute lost while {part} runs in the background (info)",
                Stats.of([r["lost"] for r in runs]).fmt(3, "s"),
                f"the same part synchronously {Stats.of([r['sync'] for r in runs]).fmt(3, 's')}; lost / its own time {own:.2f}",
                round(lost[part] / save.median, 3),
            )
        )
    floor = (lost["staging"] + min(lost["write"], lost["write_odirect"]) + lost["hash"]) / save.median
    target, met = common.at_most(floor, TARGET)
    result.rows.append(
        Row(
            "floor: staging + the cheaper write + hash lost, over a sync save",
            f"{floor:.3f}",
            f"sync dcp.save {save.fmt(2, 's')}",
            round(floor, 3),
            target,
            met,
        )
    )
    result.notes.append(
        f"the loop runs {m['threads']} intra-op threads (every core); ratios are over the median sync dcp.save of the same state"
    )
    result.details = m
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each part (default 4; --quick 2)")
    args = parser.parse_args()
    state_bytes = 0.064 * GB if args.quick else 0.5 * GB
    reps = args.reps or (2 if args.quick else 4)
    with common.scratch_dir(args.work_dir, "async_floor") as work, tempfile.TemporaryDirectory(dir=work) as scratch:
        m = measure(Path(scratch), state_bytes, reps)
    report(m).emit()


if __name__ == "__main__":
    main()
