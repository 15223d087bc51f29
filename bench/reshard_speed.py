"""Figure 10: resharding speed: offline `ckpt reshard --out` vs a plain DCP load + save; resume from another world size.

(a) Offline reshard. One process (no torch.distributed) saves the ~1 GB model of figure 1 (16 fp32
``nn.Linear`` layers, SGD without momentum: the checkpoint is the parameters; --quick ~128 MB)
through ``CheckpointManager(..., batch=BatchConfig(micro_batch=4, grad_accum=1, dp_size=1))``.
Each repetition runs, in an order rotated between repetitions:

* command: ``python -m ckpt_tool.cli.main reshard SRC --world-size 2 --out OUT`` as a subprocess,
  wall time: interpreter start, imports, the plan (DCP metadata, shape check, batch split), then
  torchrun with 2 ranks (gloo) running ``ckpt_tool.entrypoints.reshard``: each rank builds empty
  DTensor targets from the metadata, loads its half with every file hash-checked as it is read,
  writes its slice (4 writer threads, fsync, hashed as written) and the commit protocol runs;
* workers: the same ``ckpt_tool.entrypoints.reshard`` under ``torchrun --standalone --nproc-per-node=2`` through a
  small wrapper (written to the scratch directory) that times, in each rank, the interpreter and
  imports, ``init_distributed`` and the phases of ``reshard_main.main`` (plan, targets, load,
  ``dcp.save``, ``commit_staged``) by wrapping those functions where ``ckpt_tool.entrypoints.reshard`` looks them up.
  The in-process part is ``main()`` minus ``init_distributed`` on the slower rank (it still holds
  the one-off import of ``torch._dynamo`` that the first DTensor creation triggers); the data work
  alone is load + ``dcp.save`` + commit; the rest of the command (interpreters, imports, torchrun,
  rendezvous, the CLI's plan, exits) is start-up;
* reference: in this process, ``torch.distributed.checkpoint.load({"model": sd}, checkpoint_id=
  SRC_STEP, no_dist=True)`` into preallocated tensors (the saved model's own parameters, warm),
  then ``torch.distributed.checkpoint.save`` of the same dict to another directory (DCP defaults:
  one file, one writer thread, fsync).

Warm cache for all three: the source files were just written and are read by every repetition
(no eviction: other benchmarks may share this machine); outputs are deleted between runs, outside
the timings, and dirty pages are flushed (``sync``) before each timed run. Target: command /
reference <= 1.2 (the in-process ratio is shown for information).

(b) Load-time resharding. A ~0.5 GB model (--quick ~64 MB) is saved the same way at world size 1,
and ``ckpt reshard SRC --world-size 2 --out DST`` lays the same state out for 2 ranks (written by
2 torchrun ranks, DTensor ``Shard(0)``). Each repetition, order alternating, a fresh one-process
``CheckpointManager`` (same batch config, validate_on_resume=True) resumes from each, into a
model whose parameters were zeroed, timing ``resume()``; the loaded parameters must equal the
saved ones. Both directories' files are read once before each run (warm cache for both). The phases
(structure check, state-dict calls, DCP load with hash check) are timed by wrapping those
functions where the manager calls them. Ratio: 2-rank layout / 1-rank layout, for information.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import common
from common import GB, PhaseTimer, Result, Row, Stats

BENCH_DIR = Path(__file__).resolve().parent
TARGET = 1.2
STEP = 1
WORKER = '''\
"""Runs ckpt_tool.entrypoints.reshard.main() in a torchrun rank and writes its timings (bench/reshard_speed.py)."""
import json, os, sys, time
T0 = time.time()
sys.path.insert(0, {bench_dir!r})
import common
import torch.distributed.checkpoint as dcp
from ckpt_tool.entrypoints import reshard as reshard_main
T_IMPORTED = time.time()
DYNAMO_BEFORE = "torch._dynamo" in sys.modules
phases = common.PhaseTimer()
with phases.wrap(reshard_main, "init_distributed", "init_distributed"), \\
        phases.wrap(reshard_main, "check_reshard", "plan"), \\
        phases.wrap(reshard_main, "_targets", "targets"), \\
        phases.wrap(reshard_main, "load_state", "load"), \\
        phases.wrap(dcp, "save", "save"), \\
        phases.wrap(reshard_main, "commit_staged", "commit"):
    t1 = time.time()
    rc = reshard_main.main(sys.argv[1:])
    t2 = time.time()
with open("/proc/self/stat") as f:
    start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as f:
    boot = time.time() - float(f.read().split()[0])
out = {{"rank": int(os.environ["RANK"]), "process_start": boot + start_ticks / os.sysconf("SC_CLK_TCK"), "t0": T0,
       "imported": T_IMPORTED, "main_start": t1, "main_end": t2, "phases": phases.take(), "rc": rc,
       "dynamo_imported_in_main": not DYNAMO_BEFORE and "torch._dynamo" in sys.modules}}
with open(os.environ["RESHARD_TIMINGS"] + ".rank" + os.environ["RANK"], "w") as f:
    json.dump(out, f)
sys.exit(rc)
'''


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


def reshard_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "ckpt_tool.cli.main", "reshard", str(src), "--world-size", "2", "--out", str(out)]


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
        self.worker = work / "reshard_worker.py"
        self.worker.write_text(WORKER.format(bench_dir=str(BENCH_DIR)))
        self.timings = work / "timings"

    def _out(self, name: str) -> Path:
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    def command(self) -> float:
        out = self._out("out_cmd")
        common.settle()
        seconds, _ = common.time_command(reshard_cmd(self.src, out), timeout_s=900)
        check_resharded(out, 2)
        shutil.rmtree(out)
        return seconds

    def workers(self) -> tuple[float, list[dict[str, Any]]]:
        out = self._out("out_workers")
        for f in self.work.glob("timings.rank*"):
            f.unlink()
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        cmd = [*torchrun, str(self.worker), str(self.work / "result.json"), str(self.src), str(STEP), str(out)]
        env = {**os.environ, "RESHARD_TIMINGS": str(self.timings)}
        common.settle()
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        end = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"instrumented reshard exited with {proc.returncode}: {proc.stderr[-1500:]}")
        check_resharded(out, 2)
        shutil.rmtree(out)
        ranks = [json.loads(f.read_text()) for f in sorted(self.work.glob("timings.rank*"))]
        assert len(ranks) == 2 and all(r["rc"] == 0 for r in ranks), ranks
        for r in ranks:
            r["launch"], r["exit"] = start, end
        return end - start, ranks

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
    variants = ["reference", "command", "workers"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    ref_split: list[dict[str, float]] = []
    worker_runs: list[list[dict[str, Any]]] = []
    for rep in range(reps):
        for variant in variants[rep % 3 :] + variants[: rep % 3]:
            if variant == "reference":
                seconds, split = off.reference()
                ref_split.append(split)
            elif variant == "command":
                seconds = off.command()
            else:
                seconds, ranks = off.workers()
                worker_runs.append(ranks)
            times[variant].append(seconds)
        common.log(f"(a) rep {rep + 1}/{reps}: " + ", ".join(f"{v} {times[v][-1]:.2f} s" for v in variants))
    nbytes = off.nbytes
    del off
    gc.collect()
    return {"bytes": nbytes, "times": times, "reference_split": ref_split, "workers": worker_runs}


def worker_summary(ranks: list[dict[str, Any]]) -> dict[str, float]:
    """One instrumented run: the slower rank's figures (the job waits for it)."""

    def slowest(key: Any) -> float:
        return max(key(r) for r in ranks)

    return {
        "in_process": slowest(lambda r: r["main_end"] - r["main_start"] - r["phases"].get("init_distributed", 0.0)),
        "main": slowest(lambda r: r["main_end"] - r["main_start"]),
        "launch_to_process_start": slowest(lambda r: r["process_start"] - r["launch"]),
        "interpreter_and_imports": slowest(lambda r: r["imported"] - r["process_start"]),
        "init_distributed": slowest(lambda r: r["phases"].get("init_distributed", 0.0)),
        "main_end_to_exit": slowest(lambda r: r["exit"] - r["main_end"]),
        "data_work": slowest(lambda r: sum(r["phases"].get(k, 0.0) for k in ("load", "save", "commit"))),
        "dynamo_imported_in_main": float(any(r.get("dynamo_imported_in_main") for r in ranks)),
        **{k: slowest(lambda r, k=k: r["phases"].get(k, 0.0)) for k in ("plan", "targets", "load", "save", "commit")},
    }


# ----------------------------------------------------------------------------- (b)
def measure_load(work: Path, state_bytes: float, reps: int) -> dict[str, Any]:
    import torch

    import ckpt_tool.training.resume as resume_module
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
    phases = PhaseTimer()
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

    with (
        phases.wrap(resume_module, "validate_checkpoint", "structure_check"),
        phases.wrap(resume_module, "get_state_dict", "get_state_dict"),
        phases.wrap(resume_module, "load_state", "dcp_load_hash_checked"),
        phases.wrap(resume_module, "set_state_dict", "set_state_dict"),
    ):
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
def phase_text(split: dict[str, float], total: float) -> str:
    parts = " + ".join(f"{k} {v:.3f} s" for k, v in split.items())
    return f"{total:.3f} s = {parts} + other {total - sum(split.values()):.3f} s"


def report(a: dict[str, Any], b: dict[str, Any]) -> Result:
    gb = a["bytes"] / GB
    result = Result("10", f"Resharding: offline `ckpt reshard --out` ({gb:.2f} GB) and resume from another world size (seconds)")
    ref = Stats.of(a["times"]["reference"])
    cmd = Stats.of(a["times"]["command"])
    summaries = [worker_summary(run) for run in a["workers"]]
    inproc = Stats.of([s["in_process"] for s in summaries])
    start_up = Stats.of([w - s["in_process"] for w, s in zip(a["times"]["workers"], summaries, strict=True)])
    reference = f"DCP load + save, one process {ref.fmt(2, 's')}"
    ratio = cmd.median / ref.median
    target, met = common.at_most(ratio, TARGET)
    rows = [
        ("(a) `ckpt reshard --world-size 2 --out`, whole command (1 -> 2 ranks)", cmd, target, met),
        ("(a) in-process part: entrypoints.reshard.main() - init_distributed, slower rank (info)", inproc, "-", None),
        ("(a) start-up and exit of torchrun + 2 ranks around it (info)", start_up, "-", None),
    ]
    for label, stats, tgt, ok in rows:
        result.rows.append(Row(label, stats.fmt(2, "s"), reference, round(stats.median / ref.median, 3), tgt, ok))
    one, two = Stats.of(b["times"]["world1"]), Stats.of(b["times"]["world2"])
    label = f"(b) resume() at world size 1 from the 2-rank layout ({b['bytes']['world1'] / GB:.2f} GB, info)"
    result.rows.append(Row(label, two.fmt(3, "s"), f"same, from the 1-rank layout {one.fmt(3, 's')}", round(two.median / one.median, 3)))

    ref_phases = common.median_phases(a["reference_split"])
    result.notes.append(
        f"(a) reference, medians: DCP load {ref_phases['load']:.3f} s + DCP save {ref_phases['save']:.3f} s "
        "(no hashing; default FileSystemWriter: 1 thread, fsync)"
    )
    med = {k: statistics.median(s[k] for s in summaries) for k in summaries[0]}
    result.notes.append(
        "(a) instrumented workers, medians of the slower rank: torchrun launch -> rank process start "
        f"{med['launch_to_process_start']:.2f} s, interpreter + imports {med['interpreter_and_imports']:.2f} s, "
        f"init_distributed {med['init_distributed']:.2f} s; in main(): plan {med['plan']:.3f} s, targets {med['targets']:.3f} s, "
        f"load (hash-checked) {med['load']:.2f} s, dcp.save {med['save']:.2f} s, commit {med['commit']:.3f} s; "
        f"main() end -> torchrun exit {med['main_end_to_exit']:.2f} s; whole torchrun {Stats.of(a['times']['workers']).fmt(2, 's')}"
    )
    data = Stats.of([s["data_work"] for s in summaries])
    dynamo = any(s["dynamo_imported_in_main"] for s in summaries)
    result.notes.append(
        f"(a) data work alone (load + dcp.save + commit, slower rank) {data.fmt(2, 's')}, {data.median / ref.median:.3f} x the reference; "
        "the targets phase is mostly start-up"
        + (": torch._dynamo was imported inside main() (by the first DTensor creation, tensor.empty), a one-off import" if dynamo else "")
        + ". Each rank opens every source file (each tensor was saved as one chunk and each rank needs half of its rows), and "
        "ckpt_tool's hash check reads a file whole when DCP opens it: the 2 ranks read and hash the whole checkpoint each"
    )
    cli = Stats.of([c - w for c, w in zip(a["times"]["command"], a["times"]["workers"], strict=True)])
    result.notes.append(f"(a) the CLI around torchrun (interpreter, imports, plan = command - instrumented torchrun): {cli.fmt(2, 's')}")
    paired = statistics.median(c / r for c, r in zip(a["times"]["command"], a["times"]["reference"], strict=True))
    paired_in = statistics.median(s["in_process"] / r for s, r in zip(summaries, a["times"]["reference"], strict=True))
    result.notes.append(f"(a) median of per-repetition ratios (robust to drift): command {paired:.3f}, in-process {paired_in:.3f}")
    result.notes.append(
        "(a) cache: warm for all (source files read by every run, no eviction); outputs deleted between runs, outside the timings; "
        "sync before each run"
    )
    for name, where in (("world1", "from the 1-rank layout"), ("world2", "from the 2-rank layout")):
        total, split = common.median_run(b["times"][name], b["phases"][name])
        result.notes.append(f"(b) resume() {where}, the median run: {phase_text(split, total)}")
    paired_b = statistics.median(t / o for t, o in zip(b["times"]["world2"], b["times"]["world1"], strict=True))
    result.notes.append(
        f"(b) median of per-repetition ratios {paired_b:.3f}; files: {b['bytes']['world1'] / GB:.3f} GB (1 rank) vs "
        f"{b['bytes']['world2'] / GB:.3f} GB (2 ranks); batch after resume (micro, accum, dp): {b['batch_after_resume']}; "
        "warm cache for both"
    )
    result.details = {
        "offline": {"bytes": a["bytes"], "seconds": a["times"], "reference_split": a["reference_split"], "workers": summaries},
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
