"""Figure 2: how long an async save blocks the training loop, vs a sync save of the same state.

How: one process, the ~1 GB model of figure 1 (--quick ~128 MB) with SGD without momentum and
warm zero gradients. A simulated training loop: each step runs 0.4 s of compute (small matmuls
on a separate tensor, never touching the parameters, until 0.4 s have passed; the number done
measures the compute rate), then ``optimizer.step()``; every ``--every`` steps it calls
``CheckpointManager(async_save=True).save(step)``.

Blocked time of one save = seconds inside ``save()`` + seconds the manager's optimizer step
pre-hook waits for staging at the next ``optimizer.step()``. The waits are the package's timing
spans (``ckpt_tool.timing``): the pre-hook's wait is the ``save.staging_wait`` span ended inside
``optimizer.step()``; the time from ``save()`` to the commit ends with the ``store.commit`` span.
As a cross-check, the extra duration of that ``optimizer.step()`` over the median step without a
pending save is reported too. Inside ``save()``, the time spent waiting for the previous save
to finish (the ``save.wait`` span) is shown separately: a save interval shorter than the
background write shows up there.

The first async save allocates the staging buffer (fresh memory, slow first touch): it is
reported on its own row; the target applies to the following saves. Reference: sync saves
(``async_save=False``, same state, same process), median of a few after one warm-up. Compute lost
to the background save (the matmul rate of steps overlapping it vs the other steps' median rate),
in seconds per save, against the sync save: target <= 0.25 (#15; figure 2b compares torch's
thread and process checkpointers on the same measure).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
from common import GB, Result, Row, Stats

TARGET = 0.05
LOST_TARGET = 0.25  # compute lost per background save / sync save (#15)
STEP_COMPUTE_S = 0.4


@dataclass
class LoopRecord:
    compute: list[tuple[float, float, int]] = field(default_factory=list)  # (start, seconds, matmuls) per step
    optim_step: dict[int, float] = field(default_factory=dict)  # step -> seconds in optimizer.step()
    save_call: dict[int, float] = field(default_factory=dict)  # step -> seconds in save()
    wait_previous: dict[int, float] = field(default_factory=dict)  # step -> seconds of save() in wait()
    hook_wait: dict[int, float] = field(default_factory=dict)  # step of the save -> pre-hook wait
    save_window: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (save() start, commit done)


def make_compute(seconds: float) -> Callable[[], int]:
    """A function that multiplies small matrices for ``seconds``; returns how many it did."""
    import torch

    a, b = torch.randn(384, 384), torch.randn(384, 384)

    def compute() -> int:
        done, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            torch.mm(a, b)
            done += 1
        return done

    compute()  # warm up
    return compute


@contextmanager
def instrument(rec: LoopRecord, current: dict[str, Any]) -> Iterator[None]:
    """Listen to the package's spans (``ckpt_tool.timing``): the staging wait of the optimizer's
    pre-hook, the saver's wait for the previous save, the end of each commit (commits come in
    the order of the saves: at most one is in flight)."""
    from ckpt_tool import timing

    timing.check_names(["save.staging_wait", "save.wait", "store.commit"])
    uncommitted: deque[int] = current["uncommitted"]

    def heard(name: str, seconds: float, thread: str) -> None:
        if name == "save.staging_wait" and current["in_optimizer_step"] and current["pending_save"] is not None:
            rec.hook_wait[current["pending_save"]] = seconds
            current["pending_save"] = None
        elif name == "save.wait" and current["in_save"] is not None:
            rec.wait_previous[current["in_save"]] = seconds
        elif name == "store.commit" and uncommitted:
            step = uncommitted.popleft()
            rec.save_window[step] = (rec.save_window[step][0], time.perf_counter())

    with timing.listen(heard):
        yield


def training_loop(mgr: Any, optimizer: Any, compute: Callable[[], int], steps: int, every: int) -> LoopRecord:
    rec = LoopRecord()
    current: dict[str, Any] = {"in_optimizer_step": False, "pending_save": None, "in_save": None, "uncommitted": deque()}
    with instrument(rec, current):
        loop(mgr, optimizer, compute, steps, every, rec, current)
        mgr.wait()
    return rec


def loop(mgr: Any, optimizer: Any, compute: Callable[[], int], steps: int, every: int, rec: LoopRecord, current: dict[str, Any]) -> None:
    for step in range(1, steps + 1):
        start = time.perf_counter()
        done = compute()
        rec.compute.append((start, time.perf_counter() - start, done))
        current["in_optimizer_step"] = True
        rec.optim_step[step], _ = common.timed(optimizer.step)
        current["in_optimizer_step"] = False
        if step % every == 0:
            current["in_save"] = step
            rec.save_window[step] = (time.perf_counter(), float("nan"))
            current["uncommitted"].append(step)
            rec.save_call[step], _ = common.timed(lambda step=step: mgr.save(step))
            current["in_save"], current["pending_save"] = None, step
        if step % every == 1 and step > every:
            common.log(f"step {step}: save of step {step - 1} blocked {rec.save_call[step - 1] + rec.hook_wait.get(step - 1, 0):.3f} s")


def sync_save_times(work: Path, model: Any, optimizer: Any, reps: int) -> list[float]:
    mgr = common.manager(work, model, optimizer)
    times = []
    for step in range(reps + 1):
        common.settle()
        seconds, _ = common.timed(lambda step=step: mgr.save(step))
        shutil.rmtree(mgr.store.step_path(step))
        if step > 0:  # step 0 is the warm-up
            times.append(seconds)
    mgr.close()
    return times


def overlap_slowdown(rec: LoopRecord) -> tuple[float, float, float]:
    """Matmul rate of compute steps overlapping a background save vs the others (medians, per
    second), and the compute seconds lost per save: sum over overlapping steps of
    (seconds - matmuls done / idle rate)."""
    windows = list(rec.save_window.values())
    busy, idle = [], []
    for start, seconds, done in rec.compute:
        overlaps = any(s < start + seconds and start < e for s, e in windows)
        (busy if overlaps else idle).append((seconds, done))
    if not busy or not idle:
        return float("nan"), float("nan"), float("nan")
    idle_rate = statistics.median(d / t for t, d in idle)
    lost = sum(t - d / idle_rate for t, d in busy) / len(windows)
    return statistics.median(d / t for t, d in busy), idle_rate, lost


def report(rec: LoopRecord, sync: list[float], nbytes: int, every: int) -> Result:
    saves = sorted(rec.save_call)
    blocked = {s: rec.save_call[s] + rec.hook_wait.get(s, 0.0) for s in saves}
    no_save_steps = [t for s, t in rec.optim_step.items() if s - 1 not in rec.save_call and s > 1]
    base_step = statistics.median(no_save_steps)
    excess = {s: rec.optim_step[s + 1] - base_step for s in saves if s + 1 in rec.optim_step}
    sync_stats = Stats.of(sync)
    steady = Stats.of([blocked[s] for s in saves[1:]])
    first = saves[0]
    result = Result("2", f"Async save: training loop blocked vs a sync save ({nbytes / GB:.2f} GB state, seconds)")
    ratio = steady.median / sync_stats.median
    target, met = common.at_most(ratio, TARGET)
    reference = f"sync save() {sync_stats.fmt(3, 's')}"
    result.rows.append(Row(f"blocked per async save (saves 2-{len(saves)})", steady.fmt(3, "s"), reference, round(ratio, 4), target, met))
    result.rows.append(
        Row(
            "blocked, first async save (allocates the staging buffer; info)",
            f"{blocked[first]:.3f} s",
            reference,
            round(blocked[first] / sync_stats.median, 4),
        )
    )
    later = saves[1:]
    result.notes += [
        f"blocked = time in save() + staging wait in the next optimizer.step()'s pre-hook; a save every {every} steps of {STEP_COMPUTE_S} s compute",
        "per save after the first: in save() "
        + ", ".join(f"{rec.save_call[s]:.3f}" for s in later)
        + " s (of which waiting for the previous save: "
        + ", ".join(f"{rec.wait_previous.get(s, 0):.3f}" for s in later)
        + " s); "
        + "pre-hook staging wait "
        + ", ".join(f"{rec.hook_wait.get(s, 0):.3f}" for s in later)
        + " s",
        "cross-check, extra duration of the optimizer.step() after a save vs the median step without one "
        + f"({base_step * 1000:.1f} ms): "
        + ", ".join(f"{excess[s]:.3f}" for s in later if s in excess)
        + " s (this includes the slowdown of the SGD update by the background writer, not only waiting)",
        "time from save() to commit (background write + hash + commit): "
        + ", ".join(f"{rec.save_window[s][1] - rec.save_window[s][0]:.2f}" for s in saves)
        + f" s; sync save {sync_stats.median:.2f} s",
    ]
    busy, idle, lost = overlap_slowdown(rec)
    target, met = common.at_most(lost / sync_stats.median, LOST_TARGET)
    result.rows.append(
        Row(
            "compute lost while the save runs in the background, per save",
            f"{lost:.3f} s",
            reference,
            round(lost / sync_stats.median, 4),
            target,
            met,
        )
    )
    result.notes.append(
        f"compute rate during a background save: {busy:.0f} matmuls/s (median) vs {idle:.0f} without: "
        "the staging, writer and hashing threads share the 2 cores with training; not counted as blocked"
    )
    result.details = {
        "state_bytes": nbytes,
        "blocked_s": blocked,
        "save_call_s": rec.save_call,
        "hook_wait_s": rec.hook_wait,
        "wait_previous_s": rec.wait_previous,
        "optim_step_excess_s": excess,
        "sync_save_s": sync,
    }
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--saves", type=int, default=None, help="async saves in the loop (default 5; --quick 3)")
    parser.add_argument("--every", type=int, default=8, help="steps between saves (default 8, ~3.2 s)")
    parser.add_argument("--sync-reps", type=int, default=None, help="timed sync saves for the reference (default 3; --quick 2)")
    args = parser.parse_args()
    state_bytes = 0.128 * GB if args.quick else 1.0 * GB
    saves = args.saves or (3 if args.quick else 5)
    sync_reps = args.sync_reps or (2 if args.quick else 3)
    every = min(args.every, 4) if args.quick else args.every
    from ckpt_tool.core.retention import RetentionPolicy

    with common.scratch_dir(args.work_dir, "async_blocked") as work:
        model = common.build_model(state_bytes)
        optimizer = common.make_optimizer(model)
        compute = make_compute(STEP_COMPUTE_S)
        common.log("sync saves (reference)")
        sync = sync_save_times(work / "sync", model, optimizer, sync_reps)
        common.log(f"training loop: {saves} async saves, one every {every} steps")
        mgr = common.manager(work / "async", model, optimizer, async_save=True, retention=RetentionPolicy(keep_last=2))
        rec = training_loop(mgr, optimizer, compute, steps=saves * every + 1, every=every)
        mgr.close()
    report(rec, sync, common.state_nbytes(model), every).emit()


if __name__ == "__main__":
    main()
