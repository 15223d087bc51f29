"""Figure 10: resharding speed: offline `ckpt reshard --out` vs a plain DCP load + save; resume from another world size.

(a) Offline reshard. One process (no torch.distributed) saves the ~1 GB model of figure 1 (16 fp32
``nn.Linear`` layers, SGD without momentum: the checkpoint is the parameters; --quick ~128 MB)
through ``CheckpointManager(..., batch=BatchConfig(micro_batch=4, grad_accum=1, dp_size=1))``.
Each repetition runs, in an order rotated between repetitions:

* command: ``python -m ckpt_tool.cli.main reshard SRC --world-size 2 --out OUT`` as a subprocess,
  wall time: interpreter start, imports, the plan (DCP metadata, shape check, batch split), then
  the copy in that one process (the default when the state fits in half the free memory): the
  source loaded once, whole, every file hash-checked as it is read, then DCP's save protocol for
  the 2 new ranks (``training.one_process_layout``: 4 writer threads, fsync, hashed as written)
  and the commit;
* per_rank: the same with ``--per-rank``: torchrun with 2 ranks (gloo) running
  ``ckpt_tool.entrypoints.reshard_copy``: each rank builds empty DTensor targets from the metadata,
  loads its half (every file hash-checked as it is read) and writes its slice (info);
* reference: in this process, ``torch.distributed.checkpoint.load({"model": sd}, checkpoint_id=
  SRC_STEP, no_dist=True)`` into preallocated tensors (the saved model's own parameters, warm),
  then ``torch.distributed.checkpoint.save`` of the same dict to another directory (DCP defaults:
  one file, one writer thread, fsync).

Bytes read: ``rchar`` of /proc/self/io around each command (the kernel adds a reaped child's
counts to its parent, so every process of the command counts), per byte of the source files.

Warm cache for all three: the source files were just written and are read by every repetition
(no eviction: other benchmarks may share this machine); outputs are deleted between runs, outside
the timings, and dirty pages are flushed (``sync``) before each timed run. Targets (#15): command /
reference <= 1.5, bytes read per source byte ~1 (<= 1.2 with the interpreter's own reads).

(b) Load-time resharding. A ~0.5 GB model (--quick ~64 MB) is saved the same way at world size 1,
and ``ckpt reshard SRC --world-size 2 --out DST`` lays the same state out for 2 ranks (written by
2 torchrun ranks, DTensor ``Shard(0)``). Each repetition, order alternating, a fresh one-process
``CheckpointManager`` (same batch config, validate_on_resume=True) resumes from each, into a
model whose parameters were zeroed, timing ``resume()``; the loaded parameters must equal the
saved ones. Both directories' files are read once before each run (warm cache for both). The phases
are the package's timing spans (``ckpt_tool.timing``, ``LOAD_PHASES`` below): structure_check =
``resume.structure_check``, the state-dict calls = ``state_dict.*``, dcp_load_hash_checked =
``resume.load`` (DCP load with every file hash-checked as read). Ratio: 2-rank layout / 1-rank
layout, for information.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import common
from common import GB, PhaseTimer, Result, Row, Stats

TARGET = 1.5  # whole command / DCP load + save in one process (#15)
STEP = 1
RCHAR_TARGET = 1.2  # bytes read per source byte by the one-process copy (~1, #15)
LOAD_PHASES = {  # phase label (BENCHMARKS.md) -> the ckpt_tool.timing spans it adds up
    "structure_check": ("resume.structure_check",),
    "build_optimizer_state": ("state_dict.build_optimizer",),
    "get_state_dict": ("state_dict.get",),
    "dcp_load_hash_checked": ("resume.load",),
    "set_state_dict": ("state_dict.set",),
}


def new_manager(directory: Path, model: Any, optimizer: Any) -> Any:
    """A one-process ``CheckpointManager`` with the batch config (retention off)."""
    from ckpt_tool.core.batch import BatchConfig
    from ckpt_tool.core.retention import RetentionPolicy
    from ckpt_tool.training.config import CheckpointConfig
    from ckpt_tool.training.manager import CheckpointManager

    config = CheckpointConfig(directory, retention=RetentionPolicy(keep_last=1_000_000))
    return CheckpointManager(config, model=model, optimizer=optimizer, batch=BatchConfig(micro_batch=4, grad_accum=1, dp_size=1))


def save_with_batch(directory: Path, state_bytes: float, seed: int) -> tuple[Any, Path]:
    """One sync save at step 1 of a ``build_model(state_bytes)`` model, with a batch config."""
    model = common.build_model(state_bytes, seed=seed)
    optimizer = common.make_optimizer(model)
    mgr = new_manager(directory, model, optimizer)
    mgr.save(STEP)
    mgr.close()
    for p in model.parameters():
        p.grad = None
    return model, mgr.store.step_path(STEP)


def reshard_cmd(src: Path, out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "ckpt_tool.cli.main", "reshard", str(src), "--world-size", "2", "--out", str(out), *flags]


def read_chars() -> int:
    """Bytes this process and its reaped descendants read through read() and friends
    (``rchar`` of /proc/self/io: the kernel adds a child's counts to its parent when it is reaped)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def check_resharded(out: Path, world: int) -> None:
    from ckpt_tool.store.store import CheckpointStore

    manifest = CheckpointStore(out).read_manifest(STEP)
    assert manifest.world_size == world and {f.rank for f in manifest.files} == set(range(world)), manifest.files


# ----------------------------------------------------------------------------- (a)
class Offline:
    def __init__(self, work: Path, state_bytes: float) -> None:
        self.work = work
        self.src = work / "src"
        self.model, self.step_dir = save_with_batch(self.src, state_bytes, seed=1)
        self.nbytes = sum(p.stat().st_size for p in common.files_under(self.step_dir))

    def _out(self, name: str) -> Path:
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    def command(self, *flags: str) -> tuple[float, int]:
        """Wall seconds of the command and the bytes it read (all its processes)."""
        out = self._out("out_cmd")
        common.settle()
        before = read_chars()
        seconds, _ = common.time_command(reshard_cmd(self.src, out, *flags), timeout_s=900)
        read = read_chars() - before
        check_resharded(out, 2)
        shutil.rmtree(out)
        return seconds, read

    def start_up(self) -> tuple[float, int]:
        """Seconds and bytes read of an interpreter that imports what the command imports (torch,
        DCP, the CLI and the copy's modules) and does nothing else: the floor of any command."""
        before = read_chars()
        imports = "import torch, torch.distributed.checkpoint, ckpt_tool.cli.main, ckpt_tool.entrypoints.reshard_copy"
        seconds, _ = common.time_command([sys.executable, "-c", imports])
        return seconds, read_chars() - before

    def reference(self) -> tuple[float, dict[str, float]]:
        import torch.distributed.checkpoint as dcp

        out = self._out("out_reference")
        state = {"model": self.model.state_dict()}
        common.settle()
        with warnings.catch_warnings():  # "assuming the intent is to load/save in a single process": yes
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            t0 = time.perf_counter()
            dcp.load(state, checkpoint_id=str(self.step_dir), no_dist=True)
            t1 = time.perf_counter()
            dcp.save(state, checkpoint_id=str(out), no_dist=True)
            t2 = time.perf_counter()
        shutil.rmtree(out)
        return t2 - t0, {"load": t1 - t0, "save": t2 - t1}


def measure_offline(work: Path, state_bytes: float, reps: int) -> dict[str, Any]:
    off = Offline(work, state_bytes)
    common.log(f"(a) checkpoint: {off.nbytes / GB:.3f} GB in {off.step_dir}")
    common.log("(a) warm-up: the reference and the command once (first-call costs, page cache)")
    off.reference()
    off.command()
    variants = ["reference", "command", "per_rank", "start_up"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    reads: dict[str, list[int]] = {"command": [], "per_rank": [], "start_up": []}
    ref_split: list[dict[str, float]] = []
    for rep in range(reps):
        for variant in variants[rep % 4 :] + variants[: rep % 4]:
            if variant == "reference":
                seconds, split = off.reference()
                ref_split.append(split)
            elif variant == "start_up":
                seconds, read = off.start_up()
                reads[variant].append(read)
            else:
                seconds, read = off.command(*(["--per-rank"] if variant == "per_rank" else []))
                reads[variant].append(read)
            times[variant].append(seconds)
        common.log(f"(a) rep {rep + 1}/{reps}: " + ", ".join(f"{v} {times[v][-1]:.2f} s" for v in variants))
    nbytes = off.nbytes
    del off
    gc.collect()
    return {"bytes": nbytes, "times": times, "reads": reads, "reference_split": ref_split}


# ----------------------------------------------------------------------------- (b)
def measure_load(work: Path, state_bytes: float, reps: int) -> dict[str, Any]:
    import torch

    from ckpt_tool.store.store import CheckpointStore

    one = work / "world1"
    saved, _ = save_with_batch(one, state_bytes, seed=3)
    two = work / "world2"
    common.log("(b) writing the 2-rank layout with ckpt reshard --out")
    common.time_command(reshard_cmd(one, two), timeout_s=900)
    check_resharded(two, 2)
    dirs = {"world1": one, "world2": two}
    files = {k: common.files_under(CheckpointStore(d).step_path(STEP)) for k, d in dirs.items()}
    nbytes = {k: sum(p.stat().st_size for p in v) for k, v in files.items()}
    target = common.build_model(state_bytes, seed=4)
    phases = PhaseTimer(LOAD_PHASES)
    times: dict[str, list[float]] = {k: [] for k in dirs}
    splits: dict[str, list[dict[str, float]]] = {k: [] for k in dirs}
    batches: dict[str, Any] = {}

    def resume(name: str) -> tuple[float, dict[str, float]]:
        with torch.no_grad():
            for p in target.parameters():
                p.zero_()
        optimizer = common.make_optimizer(target)
        mgr = new_manager(dirs[name], target, optimizer)
        common.raw_read(files[name])  # warm, the same for both
        common.settle()
        phases.take()
        seconds, step = common.timed(mgr.resume)
        split = phases.take()
        batches[name] = mgr.batch
        mgr.close()
        assert step == STEP, step
        optimizer.zero_grad(set_to_none=True)
        for mine, ref in zip(target.parameters(), saved.parameters(), strict=True):
            assert torch.equal(mine, ref), f"{name}: resumed parameters differ from the saved ones"
        return seconds, split

    with phases.listening():
        resume("world1"), resume("world2")  # warm-up: first-call costs
        order = list(dirs)
        for rep in range(reps):
            for name in order[rep % 2 :] + order[: rep % 2]:
                seconds, split = resume(name)
                times[name].append(seconds)
                splits[name].append(split)
            common.log(f"(b) rep {rep + 1}/{reps}: " + ", ".join(f"{k} {times[k][-1]:.3f} s" for k in dirs))
    batch = {k: (b.micro_batch, b.grad_accum, b.dp_size) if b is not None else None for k, b in batches.items()}
    return {"bytes": nbytes, "state_bytes": common.state_nbytes(saved), "times": times, "phases": splits, "batch_after_resume": batch}


# ----------------------------------------------------------------------------- report
def report(a: dict[str, Any], b: dict[str, Any]) -> Result:
    gb = a["bytes"] / GB
    result = Result("10", f"Resharding: offline `ckpt reshard --out` ({gb:.2f} GB) and resume from another world size (seconds)")
    ref = Stats.of(a["times"]["reference"])
    reference = f"DCP load + save, one process {ref.fmt(2, 's')}"
    for variant, label in (
        ("command", "(a) `ckpt reshard --world-size 2 --out`, whole command (1 -> 2 ranks, one process: the default)"),
        ("per_rank", "(a) the same with --per-rank: torchrun with 2 ranks (info)"),
    ):
        stats = Stats.of(a["times"][variant])
        target, met = common.at_most(stats.median / ref.median, TARGET) if variant == "command" else ("-", None)
        result.rows.append(Row(label, stats.fmt(2, "s"), reference, round(stats.median / ref.median, 3), target, met))
    floor = Stats.of(a["times"]["start_up"])
    net = Stats.of([c - f for c, f in zip(a["times"]["command"], a["times"]["start_up"], strict=True)])
    for label, stats in (
        ("(a) the one-process command less an interpreter's start-up and imports (info)", net),
        ("(a) start-up alone: an interpreter importing torch, DCP and ckpt_tool (info)", floor),
    ):
        result.rows.append(Row(label, stats.fmt(2, "s"), reference, round(stats.median / ref.median, 3)))
    for variant, label in (("command", "one process"), ("per_rank", "--per-rank, info")):
        per_byte = statistics.median(r / a["bytes"] for r in a["reads"][variant])
        target, met = common.at_most(per_byte, RCHAR_TARGET) if variant == "command" else ("-", None)
        result.rows.append(
            Row(
                f"(a) bytes read per source byte, whole command ({label})",
                f"{statistics.median(a['reads'][variant]) / GB:.3f} GB",
                f"source files {gb:.3f} GB",
                round(per_byte, 3),
                target,
                met,
            )
        )
    one, two = Stats.of(b["times"]["world1"]), Stats.of(b["times"]["world2"])
    label = f"(b) resume() at world size 1 from the 2-rank layout ({b['bytes']['world1'] / GB:.2f} GB, info)"
    result.rows.append(Row(label, two.fmt(3, "s"), f"same, from the 1-rank layout {one.fmt(3, 's')}", round(two.median / one.median, 3)))

    ref_phases = common.median_phases(a["reference_split"])
    result.notes.append(
        f"(a) reference, medians: DCP load {ref_phases['load']:.3f} s + DCP save {ref_phases['save']:.3f} s "
        "(no hashing; default FileSystemWriter: 1 thread, fsync)"
    )
    paired = {
        v: statistics.median(c / r for c, r in zip(a["times"][v], a["times"]["reference"], strict=True)) for v in ("command", "per_rank")
    }
    result.notes.append(
        f"(a) median of per-repetition ratios (robust to drift): one process {paired['command']:.3f}, --per-rank {paired['per_rank']:.3f}"
    )
    result.notes.append(
        "(a) bytes read = rchar of /proc/self/io around the command (every process of it, reaped): the source files, "
        f"plus what the interpreters read to start (one interpreter importing torch and ckpt_tool reads {statistics.median(a['reads']['start_up']) / 1e6:.0f} MB; "
        "the one-process command runs 1, --per-rank runs 4: the CLI, torchrun and 2 ranks). --per-rank: each rank opens every "
        "source file (each tensor was saved as one chunk and each rank needs half of its rows) and the hash check reads a file whole"
    )
    result.notes.append(
        "(a) cache: warm for all (source files read by every run, no eviction); outputs deleted between runs, outside the timings; "
        "sync before each run"
    )
    for name, where in (("world1", "from the 1-rank layout"), ("world2", "from the 2-rank layout")):
        result.notes.append(
            common.phase_note(f"(b) resume() {where}, the median run", *common.median_run(b["times"][name], b["phases"][name]))
        )
    paired_b = statistics.median(t / o for t, o in zip(b["times"]["world2"], b["times"]["world1"], strict=True))
    result.notes.append(
        f"(b) median of per-repetition ratios {paired_b:.3f}; files: {b['bytes']['world1'] / GB:.3f} GB (1 rank) vs "
        f"{b['bytes']['world2'] / GB:.3f} GB (2 ranks); batch after resume (micro, accum, dp): {b['batch_after_resume']}; "
        "warm cache for both"
    )
    result.details = {
        "offline": {"bytes": a["bytes"], "seconds": a["times"], "reads": a["reads"], "reference_split": a["reference_split"]},
        "load": {"bytes": b["bytes"], "seconds": b["times"], "phases": {k: common.median_phases(v) for k, v in b["phases"].items()}},
    }
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions of each part (default 5; --quick 2)")
    args = parser.parse_args()
    reps = args.reps or (2 if args.quick else 5)
    offline_bytes = 0.128 * GB if args.quick else 1.0 * GB
    load_bytes = 0.064 * GB if args.quick else 0.5 * GB
    with common.scratch_dir(args.work_dir, "reshard_speed") as work:
        a = measure_offline(work / "offline", offline_bytes, reps)
        shutil.rmtree(work / "offline", ignore_errors=True)
        b = measure_load(work / "load", load_bytes, reps)
    report(a, b).emit()


if __name__ == "__main__":
    main()
