"""Figure 6: `ckpt validate` speed (hash check of a whole checkpoint) vs a raw read, and its memory.

How: one process; a sync save of the ~1 GB model of figure 1 (--quick ~128 MB) through
``CheckpointManager`` is written once. Each repetition runs, in an order rotated between
repetitions:

* raw cold / warm: every file of the step directory read sequentially (one thread, 8 MiB reads
  into one reused buffer), after evicting the files from the page cache (cold) or after reading
  them once (warm);
* raw cold, 4 threads (info): the same files read in a pool of 4 threads, one file per task, as
  the hashing reads them: the same I/O pattern without the hash;
* validate cold / warm: ``ckpt_tool.training.validation.validate_checkpoint(CheckpointStore(dir), step,
  threads=4)`` (what ``ckpt validate`` calls: manifest, structure, xxh3 of every file in 4
  threads, DCP metadata readable), same eviction. The result must be ``ok``.

Throughput = bytes of the step directory's files / seconds. The phases of validate_checkpoint are
the package's timing spans (``ckpt_tool.timing``, ``PHASES`` below): hash_files =
``store.hash_files``, dcp_metadata = ``validate.dcp_metadata``, manifest = ``store.read_manifest``.
Eviction: fsync +
``POSIX_FADV_DONTNEED`` per file, then ``drop_caches=3`` when allowed (root), checked with
``fincore``. Target: validate cold >= 0.8 x raw read cold (one thread, as figure 3's reference).

CLI, for information: ``.venv/bin/ckpt validate DIR --json`` as a subprocess, wall time
(interpreter start, imports, the index record it appends), with the checkpoint's files evicted
by fadvise only (no drop_caches: the Python and torch libraries stay as cached as the OS has
them); reference: validate_checkpoint cold, in process.

Memory: a fresh process of this script (``--part memory``) imports ckpt_tool and torch,
validates one checkpoint, and reports VmHWM (its peak RSS) and the peak added by the validation
alone (VmHWM reset after the imports with ``echo 5 > /proc/self/clear_refs``). Run 3 times (in
fresh processes) on a ~0.1 GB and on the ~1 GB checkpoint (--quick: ~32 MB and ~128 MB). Hashing
reads fixed-size chunks (one 8 MiB buffer per thread), so the peak should not grow with the
checkpoint: target: median peak added at 1 GB - at 0.1 GB <= 16.8 MB, two hashing buffers (the
noise: how many of the 4 threads hold a buffer at once varies from run to run); the ratio column
is that difference / the extra checkpoint bytes.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from common import GB, MB, PhaseTimer, Result, Row, Stats

TARGET = 0.8
CHUNK = 8 << 20  # ckpt_tool.store.checksums.CHUNK_BYTES: one read buffer per hashing thread
MEMORY_TOLERANCE_BYTES = 2 * CHUNK  # noise: how many hashing threads hold a buffer at the same time
THREADS = 4
STEP = 1
IMPORTS = "import ckpt_tool.cli.main, ckpt_tool.training.validation"
VARIANTS = ("raw_cold", "validate_cold", "raw_warm", "validate_warm", "raw4_cold")
PHASES = {  # phase label (BENCHMARKS.md) -> the ckpt_tool.timing spans it adds up
    "hash_files": ("store.hash_files",),
    "dcp_metadata": ("validate.dcp_metadata",),
    "manifest": ("store.read_manifest",),
}


class Runner:
    def __init__(self, directory: Path, step_dir: Path) -> None:
        from ckpt_tool.store.store import CheckpointStore

        self.directory = directory
        self.files = common.files_under(step_dir)
        self.nbytes = sum(p.stat().st_size for p in self.files)
        self.store = CheckpointStore(directory)
        self.phases = PhaseTimer(PHASES)
        self.eviction = ""
        self.resident: list[int] = []
        self.cli_eviction = ""

    def prepare(self, cold: bool) -> None:
        if cold:
            self.eviction, resident = common.evict_checked(self.files)
            if resident is not None:
                self.resident.append(resident)
        else:
            common.raw_read(self.files)

    def raw(self, cold: bool, threads: int = 1) -> tuple[float, None]:
        self.prepare(cold)
        read = (lambda: common.raw_read(self.files)) if threads == 1 else (lambda: common.raw_read_parallel(self.files, threads))
        seconds, nread = common.timed(read)
        assert nread == self.nbytes
        return seconds, None

    def validate(self, cold: bool) -> tuple[float, dict[str, float]]:
        from ckpt_tool.training.validation import validate_checkpoint

        self.prepare(cold)
        self.phases.take()
        seconds, result = common.timed(lambda: validate_checkpoint(self.store, STEP, threads=THREADS))
        assert result.ok, result.problems
        return seconds, self.phases.take()

    def run(self, variant: str) -> tuple[float, dict[str, float] | None]:
        runs: dict[str, Callable[[], Any]] = {
            "raw_cold": lambda: self.raw(cold=True),
            "raw_warm": lambda: self.raw(cold=False),
            "raw4_cold": lambda: self.raw(cold=True, threads=THREADS),
            "validate_cold": lambda: self.validate(cold=True),
            "validate_warm": lambda: self.validate(cold=False),
        }
        return runs[variant]()

    def cli(self) -> float:
        # Only the checkpoint's files are evicted (no drop_caches): the libraries the new process
        # loads stay as cached as the OS has them, like a user's second command on a node.
        method, resident = common.evict_checked(self.files, drop_all=False)
        self.cli_eviction = method
        if resident is not None:
            self.resident.append(resident)
        seconds, proc = common.time_command(common.ckpt_command("validate", str(self.directory), "--step", str(STEP), "--json"))
        [report] = json.loads(proc.stdout)["steps"]
        assert report["ok"], report
        return seconds


def measure(
    runner: Runner, reps: int, cli_reps: int
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, float]]], dict[str, list[float]]]:
    with runner.phases.listening():
        runner.run("validate_warm")  # warm-up: imports, first-call costs
        times, phases = common.rotated_repetitions(runner.run, VARIANTS, reps, runner.nbytes)
    cli: dict[str, list[float]] = {"validate": [], "imports": []}
    for i in range(cli_reps):
        cli["validate"].append(runner.cli())
        cli["imports"].append(common.time_command([sys.executable, "-c", IMPORTS])[0])
        common.log(
            f"ckpt validate --json, cold {i + 1}/{cli_reps}: {cli['validate'][-1]:.2f} s; interpreter + imports alone {cli['imports'][-1]:.2f} s"
        )
    return times, phases, cli


# ----------------------------------------------------------------------------- memory (fresh process)
def memory_part(directory: Path) -> dict[str, Any]:
    """In a fresh process: VmHWM of the process, and the peak added by validate_checkpoint alone."""
    from ckpt_tool.store.store import CheckpointStore
    from ckpt_tool.training.validation import validate_checkpoint

    store = CheckpointStore(directory)
    step = store.read_latest()
    gc.collect()
    baseline = common.rss_bytes()
    hwm_before = common.peak_rss_bytes()
    reset = common.reset_peak_rss()
    with common.RssSampler() as sampler:
        result = validate_checkpoint(store, step, threads=THREADS)
    assert result.ok, result.problems
    hwm = common.peak_rss_bytes()
    return {
        "checkpoint_bytes": result.manifest.total_bytes,
        "files": len(result.manifest.files),
        "baseline": baseline,
        "hwm_imports": hwm_before,
        "hwm_validate": hwm,
        "process_hwm": max(hwm_before, hwm),
        "added": hwm - baseline,
        "sampled_added": sampler.peak - baseline,
        "hwm_reset": reset,
    }


def memory(work: Path, big_dir: Path, small_bytes: float, runs: int) -> dict[str, list[dict[str, Any]]]:
    small_dir = work / "ckpt_small"
    model, _ = common.save_checkpoint(small_dir, small_bytes)
    del model
    out: dict[str, list[dict[str, Any]]] = {"small": [], "big": []}
    for i in range(runs):
        for size, directory in (("small", small_dir), ("big", big_dir)):
            data = common.run_json([sys.executable, __file__, "--part", "memory", "--ckpt-dir", str(directory)], timeout_s=300)
            out[size].append(data)
            common.log(
                f"memory run {i + 1}/{runs}, {size} ({data['checkpoint_bytes'] / GB:.2f} GB): VmHWM {data['process_hwm'] / MB:.0f} MB, added by validate {data['added'] / MB:.1f} MB"
            )
    shutil.rmtree(small_dir)
    return out


# ----------------------------------------------------------------------------- report
def report(
    runner: Runner,
    times: dict[str, list[float]],
    phases: dict[str, list[dict[str, float]]],
    cli: dict[str, list[float]],
    mem: dict[str, list[dict[str, Any]]],
) -> Result:
    gb = runner.nbytes / GB
    tput = {v: Stats.of(t).inverse(gb) for v, t in times.items()}
    result = Result("6", f"`ckpt validate` throughput and memory ({gb:.2f} GB of files, GB/s)")
    for temp in ("cold", "warm"):
        raw, val = tput[f"raw_{temp}"], tput[f"validate_{temp}"]
        ratio = val.median / raw.median
        target, met = common.at_least(ratio, TARGET) if temp == "cold" else ("-", None)
        label = f"validate_checkpoint(threads={THREADS}), {temp}" + (" (info)" if temp == "warm" else "")
        result.rows.append(Row(label, val.fmt(2, "GB/s"), f"raw read {temp} {raw.fmt(2, 'GB/s')}", round(ratio, 3), target, met))
    raw4, val = tput["raw4_cold"], tput["validate_cold"]
    result.rows.append(
        Row(
            f"validate_checkpoint(threads={THREADS}), cold, vs a raw read in {THREADS} threads, one file each (info)",
            val.fmt(2, "GB/s"),
            f"raw read cold, {THREADS} threads {raw4.fmt(2, 'GB/s')}",
            round(val.median / raw4.median, 3),
        )
    )
    cli_s, val_s = Stats.of(cli["validate"]), Stats.of(times["validate_cold"])
    result.rows.append(
        Row(
            "`ckpt validate DIR --json` wall time, cold (info)",
            cli_s.fmt(2, "s"),
            f"validate_checkpoint cold {val_s.fmt(2, 's')}",
            round(cli_s.median / val_s.median, 3),
        )
    )

    def med(size: str, key: str) -> Stats:
        return Stats.of([m[key] for m in mem[size]])

    small_b, big_b = mem["small"][0]["checkpoint_bytes"], mem["big"][0]["checkpoint_bytes"]
    added_small, added_big = med("small", "added"), med("big", "added")
    growth = added_big.median - added_small.median
    ratio = growth / (big_b - small_b)
    met = growth <= MEMORY_TOLERANCE_BYTES
    target = f"difference <= {MEMORY_TOLERANCE_BYTES / MB:.1f} MB"
    result.rows.append(
        Row(
            f"peak RSS added by validate_checkpoint, {big_b / GB:.2f} GB checkpoint (VmHWM - RSS before)",
            added_big.scaled(1 / MB).fmt(1, "MB"),
            f"same, {small_b / GB:.2f} GB checkpoint: {added_small.scaled(1 / MB).fmt(1, 'MB')}",
            round(ratio, 4),
            target,
            met,
        )
    )
    hwm_small, hwm_big = med("small", "process_hwm"), med("big", "process_hwm")
    result.rows.append(
        Row(
            f"VmHWM of the fresh validating process, {big_b / GB:.2f} GB (info)",
            hwm_big.scaled(1 / MB).fmt(0, "MB"),
            f"{small_b / GB:.2f} GB: {hwm_small.scaled(1 / MB).fmt(0, 'MB')}",
            round(hwm_big.median / hwm_small.median, 3),
        )
    )
    result.notes.append(
        f"CLI: `python -c '{IMPORTS}'` alone (interpreter + torch + torch.distributed.checkpoint, which the DCP metadata check needs) takes {Stats.of(cli['imports']).fmt(2, 's')}"
    )
    for variant in ("validate_cold", "validate_warm"):
        result.notes.append(common.phase_note(f"{variant}: the median run", *common.median_run(times[variant], phases[variant])))
    resident = max(runner.resident) if runner.resident else None
    result.notes.append(
        f"eviction: {runner.eviction} (CLI runs: {runner.cli_eviction}); at most {resident} bytes of the files still cached after eviction (fincore)"
    )
    result.notes.append(
        f"memory: difference of the medians {growth / MB:+.1f} MB for {(big_b - small_b) / GB:.2f} GB more checkpoint; "
        f"RSS before validate {med('big', 'baseline').median / MB:.0f} MB (python + torch + ckpt_tool), VmHWM of the imports "
        f"{med('big', 'hwm_imports').median / MB:.0f} MB; {mem['big'][0]['files']} files hashed by {THREADS} threads with one 8 MiB buffer each "
        f"(expected bound ~{THREADS * 8 * 1.048576:.0f} MB + thread stacks); VmHWM reset worked: {mem['big'][0]['hwm_reset']}"
    )
    result.details = {
        "file_bytes": runner.nbytes,
        "files": len(runner.files),
        "seconds": times,
        "cli_seconds": cli,
        "phases": {v: common.median_phases(s) for v, s in phases.items() if s},
        "memory": mem,
    }
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 5; --quick 2)")
    parser.add_argument(
        "--part", choices=("memory",), help="internal: validate --ckpt-dir in this (fresh) process and print its memory figures"
    )
    parser.add_argument("--ckpt-dir", type=Path, help="internal: the checkpoint directory for --part memory")
    args = parser.parse_args()
    if args.part == "memory":
        print(json.dumps(memory_part(args.ckpt_dir)), flush=True)
        return
    state_bytes = 0.128 * GB if args.quick else 1.0 * GB
    small_bytes = 0.032 * GB if args.quick else 0.1 * GB
    reps = args.reps or (2 if args.quick else 5)
    cli_reps = 2 if args.quick else 3
    mem_runs = 2 if args.quick else 3
    with common.scratch_dir(args.work_dir, "validate_throughput") as work:
        model, step_dir = common.save_checkpoint(work / "ckpt", state_bytes, step=STEP)
        del model
        gc.collect()
        runner = Runner(work / "ckpt", step_dir)
        times, phases, cli = measure(runner, reps, cli_reps)
        mem = memory(work, work / "ckpt", small_bytes, mem_runs)
    report(runner, times, phases, cli, mem).emit()


if __name__ == "__main__":
    main()
