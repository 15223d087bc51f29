"""Figure 1: sync save throughput vs a raw sequential write + fsync of the same bytes.

How: one process (no torchrun), a model of 16 fp32 ``nn.Linear`` layers (~1 GB; --quick ~128 MB)
and SGD without momentum, so the checkpoint is the parameters. Each repetition runs, in an order
rotated between repetitions so drift on this shared machine hits every variant alike:

* raw: the parameters' own memory written into one file in the bench directory with ``os.write``
  then ``os.fsync`` (one thread);
* for io_threads in 1, 2, 4: ``CheckpointManager(async_save=False, io_threads=N).save(step)``:
  DCP write with fsync, xxh3-128 hashes of the files, per-rank JSON, manifest, commit, LATEST.
  The parameters carry gradients (as after backward), like a loop that saves before zero_grad;
* "no grads": the default io_threads with every ``param.grad`` None (a loop that saves after
  ``zero_grad()``): the stateless SGD's state is then built on each call (torch does it with a
  ``zeros_like`` of every parameter + a step with lr=0; ckpt_tool since #15 with stride-0 zero
  gradients, ``training.torch_state``). Shown for information.

Retention is off and the previous checkpoint is deleted between runs, outside the timing; dirty
pages are flushed before each run. Each manager saves once untimed first (first-call costs).
Throughput = state bytes / seconds; the ratio is the median over repetitions of (raw seconds /
save seconds) within one repetition, robust to the drift of this machine's disk. The phases of a
save are the package's timing spans (``ckpt_tool.timing``, ``PHASES`` below): get_state_dict =
``state_dict.build_optimizer`` + ``state_dict.get``; DCP save = ``save.write``; hash_files pass =
``save.hash_read_back``; commit = ``store.commit``; "in os.fsync" = ``save.fsync``, thread-seconds
in the fsync of each file DCP wrote (since #31 the commit's own fsyncs of the manifest, rank JSON,
LATEST, index and directories, a few ms, are no longer in it: they are in commit and other).
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
from pathlib import Path
from typing import Any

import common
from common import GB, PhaseTimer, Result, Row, Stats

IO_THREADS = (1, 2, 4)
DEFAULT_IO_THREADS = 4  # ckpt_tool.training.config.DEFAULT_IO_THREADS (checked in measure())
NO_GRADS = "no_grads"  # the default io_threads, saving with param.grad None
PHASES = {  # phase label (BENCHMARKS.md) -> the ckpt_tool.timing spans it adds up
    "get_state_dict": ("state_dict.build_optimizer", "state_dict.get"),
    "dcp_save": ("save.write",),
    "hash": ("save.hash_read_back",),
    "commit": ("store.commit",),
    "fsync_thread_s": ("save.fsync",),
}
TARGET = 0.9  # #15: the median of per-repetition ratios (each save against the raw write next to it)


def timed_save(mgr: Any, step: int, phases: PhaseTimer, grads: bool = True) -> tuple[float, dict[str, float]]:
    common.settle()
    phases.take()
    with contextlib.nullcontext() if grads else common.without_grads(mgr.model):
        seconds, _ = common.timed(lambda: mgr.save(step))
    shutil.rmtree(mgr.store.step_path(step))
    return seconds, phases.take()


def timed_raw_write(path: Path, views: list[memoryview]) -> float:
    common.settle()
    seconds, _ = common.timed(lambda: common.raw_write(path, views))
    path.unlink()
    return seconds


def measure(work: Path, state_bytes: float, reps: int) -> dict[str, Any]:
    from ckpt_tool.training.config import DEFAULT_IO_THREADS as CONFIGURED

    assert CONFIGURED == DEFAULT_IO_THREADS, f"the configured default is {CONFIGURED}: update this benchmark"

    model = common.build_model(state_bytes)
    optimizer = common.make_optimizer(model)
    nbytes = common.state_nbytes(model)
    views = common.param_views(model)
    managers: dict[Any, Any] = {n: common.manager(work / f"io{n}", model, optimizer, io_threads=n) for n in IO_THREADS}
    managers[NO_GRADS] = common.manager(work / NO_GRADS, model, optimizer, io_threads=DEFAULT_IO_THREADS)
    phases = PhaseTimer(PHASES)
    variants = ["raw", *managers]
    times: dict[Any, list[float]] = {v: [] for v in variants}
    breakdown: dict[Any, list[dict[str, float]]] = {n: [] for n in managers}
    with phases.listening():
        for n, mgr in managers.items():
            common.log(f"warm-up save, {n}")
            timed_save(mgr, 0, phases, grads=n != NO_GRADS)
        for rep in range(reps):
            order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
            for variant in order:
                if variant == "raw":
                    times["raw"].append(timed_raw_write(work / "raw.bin", views))
                else:
                    seconds, split = timed_save(managers[variant], rep + 1, phases, grads=variant != NO_GRADS)
                    times[variant].append(seconds)
                    breakdown[variant].append(split)
            common.log(f"rep {rep + 1}/{reps}: " + ", ".join(f"{v}={nbytes / times[v][-1] / GB:.2f} GB/s" for v in variants))
    for mgr in managers.values():
        mgr.close()
    return {"bytes": nbytes, "times": times, "breakdown": breakdown}


def phase_note(label: str, total: float, split: dict[str, float]) -> str:
    named = ("get_state_dict", "dcp_save", "hash", "commit")
    rest = total - sum(split.get(k, 0.0) for k in named)
    return (
        f"{label}: the median save, {total:.3f} s = get_state_dict {split.get('get_state_dict', 0):.3f} s "
        f"+ DCP save {split.get('dcp_save', 0):.3f} s (in os.fsync: {split.get('fsync_thread_s', 0):.3f} thread-s) "
        f"+ hash_files pass {split.get('hash', 0):.3f} s + commit {split.get('commit', 0):.3f} s + other {rest:.3f} s"
    )


def report(data: dict[str, Any]) -> Result:
    nbytes = data["bytes"]
    gb = nbytes / GB
    raw = Stats.of(data["times"]["raw"]).inverse(gb)
    result = Result("1", f"Sync save throughput ({gb:.2f} GB state, GB/s = 1e9 bytes/s)")
    reference = f"raw write+fsync {raw.fmt(2, 'GB/s')}"
    raw_t = data["times"]["raw"]
    # The ratio is taken per repetition (the raw write and the saves of one repetition run back to
    # back) and the median of those is reported: the raw reference alone swung 0.4-2.3 GB/s on
    # this machine between runs, which a ratio of medians taken minutes apart inherits.
    paired = {n: statistics.median(r / t for r, t in zip(raw_t, data["times"][n], strict=True)) for n in (*IO_THREADS, NO_GRADS)}
    for n in IO_THREADS:
        save = Stats.of(data["times"][n]).inverse(gb)
        ratio = paired[n]
        target, met = common.at_least(ratio, TARGET)
        label = f"save(), io_threads={n}" + (" (current default)" if n == DEFAULT_IO_THREADS else "")
        result.rows.append(Row(label, save.fmt(2, "GB/s"), reference, round(ratio, 3), target, met))
    no_grads = Stats.of(data["times"][NO_GRADS]).inverse(gb)
    result.rows.append(
        Row(
            f"save(), io_threads={DEFAULT_IO_THREADS}, param.grad None (info)",
            no_grads.fmt(2, "GB/s"),
            reference,
            round(paired[NO_GRADS], 3),
        )
    )
    for n in (*IO_THREADS, NO_GRADS):
        label = f"io_threads={n}" if n != NO_GRADS else f"io_threads={DEFAULT_IO_THREADS}, grads None"
        result.notes.append(phase_note(label, *common.median_run(data["times"][n], data["breakdown"][n])))
    result.notes.append(
        "ratio = the median of per-repetition ratios (each save against the raw write of its own repetition); "
        "the ratio of the medians, for comparison: "
        + ", ".join(f"io_threads={n}: {Stats.of(data['times'][n]).inverse(gb).median / raw.median:.3f}" for n in IO_THREADS)
    )
    best = max(IO_THREADS, key=lambda n: Stats.of(data["times"][n]).inverse(1).median)
    result.notes.append(f"fastest io_threads in this run: {best}")
    result.notes.append(f"raw write+fsync of {gb:.2f} GB: {Stats.of(data['times']['raw']).median:.3f} s median (one thread, one file)")
    result.details = {
        "state_bytes": nbytes,
        "seconds": {str(k): v for k, v in data["times"].items()},
        "phases": {str(n): common.median_phases(v) for n, v in data["breakdown"].items()},
    }
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 9; --quick 2)")
    args = parser.parse_args()
    state_bytes = 0.128 * GB if args.quick else 1.0 * GB
    reps = args.reps or (2 if args.quick else 9)
    with common.scratch_dir(args.work_dir, "save_throughput") as work:
        data = measure(work, state_bytes, reps)
    report(data).emit()


if __name__ == "__main__":
    main()
