"""Figure 2b: DCP's async checkpointers on this machine: the thread writer vs a background process.

How: one process, torch.distributed initialised with one gloo rank (DCP's process-based
checkpointer needs a process group), the ~0.5 GB model of figure 1 (--quick ~64 MB). For each
mode, in a fresh process: a compute loop of small matmuls (its rate alone, measured for 1 s
before each save, is the reference), then ``dcp.async_save`` with a ``DefaultStager`` (async
staging; shared memory for the process mode, which sends the staged state to its process) and
``FileSystemWriter`` (4 threads, fsync, as ckpt_tool's saver); while the upload runs the loop keeps
computing. Compute lost per save = upload seconds - matmuls done during the upload / the rate
alone; reported against a sync ``dcp.save`` of the same state in the same process. The first save
of each mode is reported apart (the process mode spawns its process then: an interpreter and
torch's imports), the ratio uses the following ones. Modes:

* thread: ``AsyncCheckpointerType.THREAD`` (what ``CheckpointManager(async_save=True)`` uses);
* process: ``AsyncCheckpointerType.PROCESS``;
* thread_nice / process_nice: the same with every writer thread at nice 19 (set by the filesystem
  when a thread opens its first file), to see whether the kernel's scheduler gives training the
  cores when the save competes for them.

This measures torch's checkpointers alone (no hashing, no commit): the choice between them, not
ckpt_tool's overhead (figure 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
from common import GB, Result, Row, Stats
from torch.distributed.checkpoint.filesystem import FileSystem

MODES = ("thread", "process", "thread_nice", "process_nice")
TARGET = 0.25  # compute lost per background save / sync save (#15)


class NiceFileSystem(FileSystem):
    """DCP's filesystem with every thread that opens a file set to nice 19 (module level: the
    process checkpointer pickles the writer into its process)."""

    def create_stream(self, path: Any, mode: str) -> Any:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < 19:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
        return super().create_stream(path, mode)


def one_mode(mode: str, state_bytes: float, saves: int, work: Path) -> dict[str, Any]:
    """Runs in its own process (``--mode``): the measurements of one mode."""
    import shutil
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    warnings.filterwarnings("ignore")
    process = mode.startswith("process")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(dir=work), 1), rank=0, world_size=1)
    state = common.build_model(state_bytes).state_dict()
    loop = common.MatmulLoop()
    rate = loop.rate

    def writer(name: str) -> FileSystemWriter:
        w = FileSystemWriter(work / name, single_file_per_rank=True, sync_files=True, thread_count=4, overwrite=True)
        if mode.endswith("nice"):
            w.fs = NiceFileSystem()
        return w

    rate(1.0)  # warm-up
    sync = []
    for i in range(2):
        common.settle()
        seconds, _ = common.timed(lambda i=i: dcp.save(state, storage_writer=writer(f"sync{i}")))
        sync.append(seconds)
        shutil.rmtree(work / f"sync{i}")
    stager = DefaultStager(
        StagingOptions(use_pinned_memory=False, use_shared_memory=process, use_async_staging=True, use_non_blocking_copy=False)
    )
    kind = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
    runs = []
    for i in range(saves):
        common.settle()
        alone = rate(1.0)
        start = time.perf_counter()
        response = dcp.async_save(state, storage_writer=writer(f"async{i}"), async_stager=stager, async_checkpointer_type=kind)
        response.staging_completion.result()
        staged = time.perf_counter() - start
        upload_start = time.perf_counter()
        done = loop.matmuls_until(response.upload_completion.done, 0.1)
        upload = time.perf_counter() - upload_start
        response.upload_completion.result()
        runs.append({"lost": upload - done / alone, "upload": upload, "staging": staged, "rate_alone": alone})
        shutil.rmtree(work / f"async{i}")
    stager.close()
    return {"mode": mode, "sync": sync, "runs": runs}


def report(results: dict[str, dict[str, Any]], nbytes: float) -> Result:
    result = Result("2b", f"Async checkpointers: compute lost while a save runs in the background ({nbytes / GB:.2f} GB state)")
    for mode in MODES:
        r = results[mode]
        sync = Stats.of(r["sync"])
        later = r["runs"][1:]
        lost = Stats.of([x["lost"] for x in later])
        ratio = statistics.median(x["lost"] / sync.median for x in later)
        target, met = common.at_most(ratio, TARGET) if mode == "thread" else ("-", None)
        label = f"compute lost per save, {mode}" + (" (the default)" if mode == "thread" else " (info)")
        result.rows.append(Row(label, lost.fmt(3, "s"), f"sync dcp.save {sync.fmt(2, 's')}", round(ratio, 3), target, met))
    for mode in MODES:
        first, later = results[mode]["runs"][0], results[mode]["runs"][1:]
        result.notes.append(
            f"{mode}: first save {first['lost']:.2f} s lost in a {first['upload']:.2f} s upload (staging {first['staging']:.2f} s); "
            f"later uploads {Stats.of([x['upload'] for x in later]).fmt(2, 's')}, staging {Stats.of([x['staging'] for x in later]).fmt(2, 's')}"
        )
    result.notes.append(
        "each mode in its own process, in the order " + ", ".join(MODES) + "; the rate alone is re-measured before each save"
    )
    result.details = results
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--saves", type=int, default=None, help="async saves per mode (default 5; --quick 3)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    state_bytes = 0.064 * GB if args.quick else 0.5 * GB
    saves = args.saves or (3 if args.quick else 5)
    if args.mode:  # the child: one mode, its result as the last line
        with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
            print(json.dumps(one_mode(args.mode, state_bytes, saves, Path(work))), flush=True)
        os._exit(0)  # DCP's checkpoint process is a daemon: do not wait for its shutdown message
    results = {}
    with common.scratch_dir(args.work_dir, "async_modes") as work:
        for mode in MODES:
            common.log(f"mode {mode}")
            cmd = [sys.executable, __file__, "--mode", mode, "--work-dir", str(work), "--saves", str(saves)]
            cmd += ["--quick"] if args.quick else []
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"{mode}: exit {proc.returncode}: {proc.stderr[-1500:]}")
            results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    report(results, state_bytes).emit()


if __name__ == "__main__":
    main()
