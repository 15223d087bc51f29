"""Figure 3: load throughput with the hash check vs a raw read of the same files, cold and warm.

How: one process; a sync save of the ~1 GB model of figure 1 (--quick ~128 MB) is written once.
Each repetition runs, in an order rotated between repetitions:

* raw cold / warm: every file of the checkpoint read sequentially (one thread, 8 MiB reads into
  one reused buffer), after evicting the files from the page cache (cold) or after reading them
  once (warm);
* resume cold / warm: a fresh ``CheckpointManager(validate_on_resume=True)`` on the directory,
  ``resume()`` into a model of the same shape whose parameters were zeroed (a new SGD without
  state and without gradients, as in a restarted process): crash clean-up, checks, xxh3 hash
  check of every file (a pass before the load, or while DCP reads, depending on the version
  under test), DCP load, ``set_state_dict``, per-rank JSON. The parameters are compared with the
  saved ones after each run (outside the timing);
* resume cold with ``validate_on_resume=False``, for information (in versions that hash while
  loading, this skips only the structure check);
* resume cold reading 1 and 2 files at once (``io_threads``; the default 4 is ``resume cold``):
  the reader's thread count, picked by this measurement (#15);
* dcp cold: torch's own path on the same files and target, what a script without ckpt-tool does:
  ``get_state_dict``, ``dcp.load`` (``FileSystemReader``, no hash check), ``set_state_dict``.

Memory: the peak RSS of each cold resume above the RSS just before it (VmHWM after
``clear_refs``), i.e. what ``resume()`` adds beyond the state it loads into.

torch's own path (``dcp cold``) pays ``get_state_dict``'s initialisation of the empty optimizer (a
``zeros_like`` of every parameter + a step with lr=0), ``set_state_dict``'s second one (SGD
without momentum keeps no state, so it is still empty) and a ``load_state_dict`` copy of every
model entry; ``resume()`` builds the optimizer state with stride-0 zero gradients and sets only
what DCP did not fill in place (``training.torch_state``). The phase split shows each part.

Eviction: fsync + ``POSIX_FADV_DONTNEED`` on each file, then ``drop_caches=3`` when allowed
(root); the bytes still resident are checked with ``fincore``. Throughput = bytes of the
checkpoint's files / seconds. The phases of ``resume()`` are the package's timing spans
(``ckpt_tool.timing``, ``PHASES`` below): crash_cleanup = ``resume.crash_cleanup``;
store_check_files = ``resume.structure_check`` (since #31 the whole structure check: the store's
file check plus the mesh checks and the DCP metadata read, about a millisecond more than the file
check alone); build_optimizer_state = ``state_dict.build_optimizer``; get_state_dict =
``state_dict.get``; dcp_load = ``load.dcp`` (DCP's load through the hash-checking reader);
set_state_dict = ``state_dict.set``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from common import GB, PhaseTimer, Result, Row, Stats

from ckpt_tool.training.config import DEFAULT_IO_THREADS

TARGET = 0.6  # resume cold / raw cold read (#15)
DCP_TARGET = 1.5  # resume cold throughput / plain dcp.load cold throughput (#15)
RSS_TARGET = 64 << 20  # peak RSS resume() adds beyond the state (#15)
VARIANTS = ("raw_cold", "resume_cold", "dcp_cold", "raw_warm", "resume_warm", "resume_cold_no_validate", "resume_cold_1t", "resume_cold_2t")
PHASES = {  # phase label (BENCHMARKS.md) -> the ckpt_tool.timing spans it adds up
    "crash_cleanup": ("resume.crash_cleanup",),
    "store_check_files": ("resume.structure_check",),
    "build_optimizer_state": ("state_dict.build_optimizer",),
    "get_state_dict": ("state_dict.get",),
    "dcp_load": ("load.dcp",),
    "set_state_dict": ("state_dict.set",),
}
READER_THREADS = {"resume_cold_1t": 1, "resume_cold_2t": 2, "resume_cold": DEFAULT_IO_THREADS}  # files read at once


class Loader:
    """Runs one timed variant; keeps the target model and the eviction bookkeeping."""

    def __init__(self, directory: Path, step_dir: Path, reference: Any, state_bytes: float) -> None:
        import torch

        self.torch = torch
        self.directory = directory
        self.files = common.files_under(step_dir)
        self.nbytes = sum(p.stat().st_size for p in self.files)
        self.largest = max(p.stat().st_size for p in self.files)
        self.reference = reference
        self.target = common.build_model(state_bytes, seed=2)
        self.phases = PhaseTimer(PHASES)
        self.eviction = ""
        self.resident_after_evict: list[int] = []
        self.rss_added: list[int] = []

    def prepare(self, cold: bool) -> None:
        if cold:
            self.eviction = common.evict(self.files)
            resident = common.resident_bytes(self.files)
            if resident is not None:
                self.resident_after_evict.append(resident)
        else:
            common.raw_read(self.files)

    def raw(self, cold: bool) -> float:
        self.prepare(cold)
        seconds, nread = common.timed(lambda: common.raw_read(self.files))
        assert nread == self.nbytes
        return seconds

    def resume(self, cold: bool, validate: bool, threads: int = DEFAULT_IO_THREADS) -> tuple[float, dict[str, float]]:
        with self.torch.no_grad():
            for p in self.target.parameters():
                p.zero_()
        optimizer = common.make_optimizer(self.target, grads=False)
        mgr = common.manager(self.directory, self.target, optimizer, validate_on_resume=validate, io_threads=threads)
        self.prepare(cold)
        self.phases.take()
        before, reset = common.rss_bytes(), common.reset_peak_rss()
        seconds, step = common.timed(mgr.resume)
        if cold and validate and reset:
            self.rss_added.append(common.peak_rss_bytes() - before)
        phases = self.phases.take()
        mgr.close()
        assert step == 1, step
        optimizer.zero_grad(set_to_none=True)
        for mine, saved in zip(self.target.parameters(), self.reference.parameters(), strict=True):
            assert self.torch.equal(mine, saved), "resumed parameters differ from the saved ones"
        return seconds, phases

    def dcp(self) -> float:
        """torch's own path, no ckpt-tool: get_state_dict, dcp.load, set_state_dict."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        with self.torch.no_grad():
            for p in self.target.parameters():
                p.zero_()
        optimizer = common.make_optimizer(self.target, grads=False)
        step_dir = self.files[0].parent
        self.prepare(cold=True)

        def load() -> None:
            model_sd, optim_sd = get_state_dict(self.target, optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=step_dir, no_dist=True)
            set_state_dict(self.target, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

        seconds, _ = common.timed(load)
        for mine, saved in zip(self.target.parameters(), self.reference.parameters(), strict=True):
            assert self.torch.equal(mine, saved), "dcp.load gave other parameters"
        return seconds

    def run(self, variant: str) -> tuple[float, dict[str, float] | None]:
        runs: dict[str, Callable[[], Any]] = {
            "raw_cold": lambda: (self.raw(cold=True), None),
            "raw_warm": lambda: (self.raw(cold=False), None),
            "resume_cold": lambda: self.resume(cold=True, validate=True),
            "resume_warm": lambda: self.resume(cold=False, validate=True),
            "resume_cold_no_validate": lambda: self.resume(cold=True, validate=False),
            "dcp_cold": lambda: (self.dcp(), None),
            **{v: (lambda t=t: self.resume(cold=True, validate=True, threads=t)) for v, t in READER_THREADS.items()},
        }
        return runs[variant]()


def measure(work: Path, state_bytes: float, reps: int) -> tuple[Loader, dict[str, list[float]], dict[str, list[dict[str, float]]]]:
    directory = work / "ckpt"
    reference, step_dir = common.save_checkpoint(directory, state_bytes)
    loader = Loader(directory, step_dir, reference, state_bytes)
    with loader.phases.listening():
        loader.run("resume_warm")  # warm-up: imports, first-call costs
        times, phases = common.rotated_repetitions(loader.run, VARIANTS, reps, loader.nbytes)
    return loader, times, phases


def report(loader: Loader, times: dict[str, list[float]], phases: dict[str, list[dict[str, float]]]) -> Result:
    gb = loader.nbytes / GB
    tput = {v: Stats.of(t).inverse(gb) for v, t in times.items()}
    result = Result("3", f"Load throughput incl. hash check ({gb:.2f} GB of files, GB/s)")
    for temp in ("cold", "warm"):
        raw, load = tput[f"raw_{temp}"], tput[f"resume_{temp}"]
        ratio = load.median / raw.median
        target, met = common.at_least(ratio, TARGET) if temp == "cold" else ("-", None)
        label = f"resume(), validate_on_resume=True, {temp}" + (" (info)" if temp == "warm" else "")
        result.rows.append(Row(label, load.fmt(2, "GB/s"), f"raw read {temp} {raw.fmt(2, 'GB/s')}", round(ratio, 3), target, met))
    dcp, resume = tput["dcp_cold"], tput["resume_cold"]
    ratio = resume.median / dcp.median
    target, met = common.at_least(ratio, DCP_TARGET)
    result.rows.append(
        Row(
            "resume(), validate_on_resume=True, cold, vs torch's own dcp.load",
            resume.fmt(2, "GB/s"),
            f"plain dcp.load cold {dcp.fmt(2, 'GB/s')}",
            round(ratio, 3),
            target,
            met,
        )
    )
    if loader.rss_added:
        added = max(loader.rss_added)
        largest = loader.largest / 2**20
        result.rows.append(
            Row(
                "peak RSS added by a cold resume() beyond the state (VmHWM - RSS before, worst run)",
                f"{added / 2**20:.1f} MiB",
                f"largest file {largest:.0f} MiB",
                round(added / 2**20, 1),
                f"<= {RSS_TARGET >> 20} MiB",
                added <= RSS_TARGET,
            )
        )
    no_hash = tput["resume_cold_no_validate"]
    raw_cold = f"raw read cold {tput['raw_cold'].fmt(2, 'GB/s')}"
    result.rows.append(
        Row(
            "resume(), validate_on_resume=False, cold (info)",
            no_hash.fmt(2, "GB/s"),
            raw_cold,
            round(no_hash.median / tput["raw_cold"].median, 3),
        )
    )
    fastest = max(READER_THREADS, key=lambda v: tput[v].median)
    for variant, threads in sorted(READER_THREADS.items(), key=lambda item: item[1]):
        chosen = " (the default)" if threads == DEFAULT_IO_THREADS else ""
        result.rows.append(
            Row(
                f"resume() cold, {threads} file(s) read at once{chosen}",
                tput[variant].fmt(2, "GB/s"),
                raw_cold,
                round(tput[variant].median / tput["raw_cold"].median, 3),
            )
        )
    result.notes.append(
        f"reader threads: the fastest median in this run is {READER_THREADS[fastest]} file(s) at once; "
        f"the default (io_threads={DEFAULT_IO_THREADS}) is {tput['resume_cold'].median / tput[fastest].median:.2f} of it"
    )
    for variant in (v for v in VARIANTS if v.startswith("resume")):
        result.notes.append(common.phase_note(f"{variant}: the median run", *common.median_run(times[variant], phases[variant])))
    resident = max(loader.resident_after_evict) if loader.resident_after_evict else None
    result.notes.append(f"eviction: {loader.eviction}; at most {resident} bytes of the files still cached after eviction (fincore)")
    result.details = {
        "file_bytes": loader.nbytes,
        "files": len(loader.files),
        "seconds": times,
        "phases": {v: common.median_phases(s) for v, s in phases.items() if s},
    }
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 5; --quick 2)")
    args = parser.parse_args()
    state_bytes = 0.128 * GB if args.quick else 1.0 * GB
    reps = args.reps or (2 if args.quick else 5)
    with common.scratch_dir(args.work_dir, "load_throughput") as work:
        loader, times, phases = measure(work, state_bytes, reps)
        shutil.rmtree(work / "ckpt")
    report(loader, times, phases).emit()


if __name__ == "__main__":
    main()
