"""The GPU check (issue #32): one command, at most 6 minutes on one GPU, six measurements.

    PYTHONPATH=. python3 bench/gpu_check.py [--out DIR]             # on the GPU machine (docs/gpu-check.md)
    python bench/gpu_check.py --device cpu --tiny                   # every step at tiny size on the CPU
    make gpu-check                                                  # no CUDA here: "nothing measured", exit 0

Steps (each one's result is kept whatever the others do; one that fails says why):
  0. imports: every version-sensitive torch name the package uses, imported under this torch;
  1. gpt_exact_async / gpt_exact_sync: the GPT recipe (1 rank, torchrun, NCCL on CUDA, FSDP2,
     dropout 0.1) SIGKILLed mid-run and resumed: every step's loss, LR and grad norm bit-identical
     to the run that never stopped; with async saves, then sync saves;
  2. cnn_exact_amp: the conv recipe with --amp (fp16 autocast + GradScaler), the same;
  3. big_save: one process, a state of --state-gb in device memory: an async save's blocked time
     (the save call + its staging) and the compute lost while it writes (a matmul loop timed
     during the write vs idle), a sync save; save and cold-load GB/s, and a raw write/read of the
     same bytes on the same disk (the disk stated);
  4. fast_tier: the local tier's staging from device memory (blocked time) and a local resume;
  5. nvml: the NVML reader on the GPU (utilisation, ECC, cost of a reading) and a short ``ckpt
     run`` of the GPT recipe whose events hold no ``gpu_error`` (on the CPU: a fake reader);
  6. cpu_side: ``ckpt verify`` and ``ckpt export`` of the step-1 checkpoint with no GPU visible.

Writes ``OUT/gpu-check.json`` and ``OUT/gpu-check.md``; exit 0 when every step passed, 1 otherwise.
It times the package only through its public seams: the recipes (torchrun), the CLI, and
``ckpt_tool.timing`` spans (``common.PhaseTimer``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from ckpt_tool.recipes.launch import FAST_ARGS, ckpt_run_command, compare_runs, read_metrics, recipe_args, torchrun_command

GPT, CNN = "ckpt_tool.recipes.tiny_gpt", "ckpt_tool.recipes.tiny_cnn"
# torch names the package imports that moved or appeared between versions (checked under the device's torch)
VERSION_SENSITIVE = (
    "torch.distributed.fsdp:fully_shard",
    "torch.distributed.checkpoint:async_save",
    "torch.distributed.checkpoint.staging:DefaultStager",
    "torch.distributed.checkpoint.staging:StagingOptions",
    "torch.distributed.checkpoint.state_dict:get_state_dict",
    "torch.distributed.checkpoint.state_dict:set_optimizer_state_dict",
    "torch.distributed.checkpoint._traverse:set_element",
    "torch.distributed.checkpoint.planner_helpers:_create_write_items",
    "torch.distributed._shard._utils:narrow_tensor_by_index",
    "torch.distributed.tensor:_random",
    "torch.distributed.tensor.parallel:ColwiseParallel",
    "torch._subclasses.fake_tensor:FakeTensorMode",
)


@dataclass(frozen=True)
class Sizes:
    gpt_steps: int
    gpt_crash_at: int
    gpt_save_every: int
    cnn_steps: int
    cnn_crash_at: int
    state_gb: float
    matmul: int  # the compute loop's square matrix size
    nvml_steps: int


FULL = Sizes(gpt_steps=24, gpt_crash_at=14, gpt_save_every=5, cnn_steps=20, cnn_crash_at=12, state_gb=4.0, matmul=4096, nvml_steps=60)
TINY = Sizes(gpt_steps=6, gpt_crash_at=4, gpt_save_every=2, cnn_steps=6, cnn_crash_at=4, state_gb=0.016, matmul=128, nvml_steps=12)


@dataclass
class Step:
    name: str
    ok: bool
    detail: str
    figures: dict[str, Any]
    seconds: float


class Check:
    def __init__(self, device: str, sizes: Sizes, out: Path, work: Path, budget_s: float) -> None:
        self.device, self.sizes, self.out, self.work = device, sizes, out, work
        self.deadline = time.monotonic() + budget_s
        self.steps: list[Step] = []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        root = str(Path(__file__).resolve().parent.parent)  # the project from the source tree
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))

    def run_step(self, name: str, fn: Callable[[], tuple[bool, str, dict[str, Any]]]) -> None:
        t0 = time.monotonic()
        if t0 > self.deadline:
            self.steps.append(Step(name, False, "skipped: the time budget ran out", {}, 0.0))
            return
        common.log(f"gpu_check: {name} ...")
        try:
            ok, detail, figures = fn()
        except Exception as exc:  # noqa: BLE001 - the step failed: say why, go on with the next
            ok, detail, figures = False, f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()[-2500:]}
        self.steps.append(Step(name, ok, detail, figures, round(time.monotonic() - t0, 2)))
        common.log(f"gpu_check: {name}: {'ok' if ok else 'FAILED'}: {detail}")

    def sh(self, cmd: list[str], log: Path, timeout: float = 240, env: dict[str, str] | None = None) -> int:
        with open(log, "ab") as f:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env or self.env, timeout=timeout).returncode

    # ------------------------------------------------------------------ steps
    def imports(self) -> tuple[bool, str, dict[str, Any]]:
        missing = []
        for item in VERSION_SENSITIVE:
            module, _, name = item.partition(":")
            try:
                getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as exc:
                missing.append(f"{item} ({exc})")
        import torch

        return not missing, ("all found" if not missing else "missing: " + "; ".join(missing)), {"torch": torch.__version__}

    def exact(
        self, name: str, module: str, extra: list[str], steps: int, crash_at: int, save_every: int
    ) -> tuple[bool, str, dict[str, Any]]:
        base = self.work / name
        runs = {}
        for kind in ("reference", "resumed"):
            d = base / kind
            d.mkdir(parents=True)
            args = recipe_args(d / "ckpt", d / "metrics.jsonl", steps, save_every, "--device", self.device, *extra)
            if kind == "resumed":
                args += ["--crash-at-step", str(crash_at)]
            first = self.sh(torchrun_command(1, args, module), d / "log.txt")
            second = self.sh(torchrun_command(1, args, module), d / "log.txt") if kind == "resumed" else 0
            runs[kind] = (first, second, d)
        ref_rc, _, ref = runs["reference"]
        killed_rc, resumed_rc, res = runs["resumed"]
        if ref_rc != 0 or resumed_rc != 0 or killed_rc == 0:
            tail = (res / "log.txt").read_text(errors="replace")[-1500:] + (ref / "log.txt").read_text(errors="replace")[-800:]
            return False, f"exit codes: reference {ref_rc}, killed {killed_rc} (want non-zero), resumed {resumed_rc}", {"log_tail": tail}
        cmp = compare_runs(read_metrics(ref / "metrics.jsonl"), read_metrics(res / "metrics.jsonl"))
        figures = {"steps_compared": cmp.steps_compared, "lines_compared": cmp.lines_compared, "missing_steps": list(cmp.missing_steps)}
        if not cmp.identical:
            figures["first_mismatch"] = [asdict(m) if m is not None else None for m in cmp.mismatches[0]] if cmp.mismatches else None
            return False, f"not bit-identical: {len(cmp.mismatches)} line(s) differ, missing steps {list(cmp.missing_steps)}", figures
        return True, f"bit-identical over {cmp.steps_compared} steps after a SIGKILL at step {crash_at}", figures

    def wrong_numbers(self) -> tuple[bool, str, dict[str, Any]]:
        """#35 on the device: a NaN in the gradient at the crash step, once, under ``ckpt run`` (1 rank):
        the replay from the checkpoint names rank 0 (transient) and the run ends bit-identical to
        gpt_exact_sync's reference; the replicas' fingerprints on the device are the same for the same
        bits and change with one ulp."""
        import torch

        from ckpt_tool.supervise.run_dir import read_events
        from ckpt_tool.training.replicas import fingerprints

        s, d = self.sizes, self.work / "wrong_numbers"
        d.mkdir()
        reference = self.work / "gpt_exact_sync" / "reference" / "metrics.jsonl"
        if not reference.exists():
            return False, "needs gpt_exact_sync's reference run (it did not run)", {}
        args = recipe_args(d / "ckpt", d / "metrics.jsonl", s.gpt_steps, s.gpt_save_every, "--device", self.device, *FAST_ARGS)
        args += ["--corrupt-at-step", str(s.gpt_crash_at), "--corrupt-rank", "0"]
        rc = self.sh(ckpt_run_command(1, d / "run", args, ()), d / "log.txt")
        verdicts = [e for e in read_events(d / "run") if e["event"] == "anomaly_replayed"]
        newest = {m.step: m for m in read_metrics(d / "metrics.jsonl")} if (d / "metrics.jsonl").exists() else {}
        cmp = compare_runs(read_metrics(reference), [newest[k] for k in sorted(newest)])
        t = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)).to(self.device)
        moved = t.clone()
        moved[-1] = torch.nextafter(moved[-1], torch.tensor(float("inf"), device=self.device))
        same_prints = fingerprints([t]) == fingerprints([t.clone()]) and fingerprints([moved]) != fingerprints([t])
        figures = {
            "exit": rc,
            "verdicts": [v.get("message") for v in verdicts],
            "identical": cmp.identical,
            "fingerprints_agree": same_prints,
        }
        ok = rc == 0 and [(v["verdict"], v["ranks"]) for v in verdicts] == [("transient", [0])] and cmp.identical and same_prints
        if not ok:
            figures["log_tail"] = (d / "log.txt").read_text(errors="replace")[-1500:]
        detail = f"NaN at step {s.gpt_crash_at}: {verdicts[0]['verdict'] if verdicts else 'no verdict'}"
        return ok, f"{detail}, rank 0 named, bit-identical: {cmp.identical}; fingerprints on the device see one ulp: {same_prints}", figures

    def _inner(self, name: str, folder: str, timeout_s: float) -> tuple[bool, str, dict[str, Any]]:
        """Step ``name`` in a process of its own (``--inner NAME``), its figures read back as JSON."""
        d = self.work / folder
        d.mkdir()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", name, "--device", self.device, "--out", str(d)]
        cmd += ["--tiny"] if self.sizes is TINY else []
        result = common.run_json(cmd, timeout_s, self.env)
        return bool(result.pop("ok")), str(result.pop("detail")), result

    def big_save(self) -> tuple[bool, str, dict[str, Any]]:
        return self._inner("big_save", "big", 300)

    def fast_tier(self) -> tuple[bool, str, dict[str, Any]]:
        return self._inner("fast_tier", "fast", 200)

    def nvml(self) -> tuple[bool, str, dict[str, Any]]:
        figures: dict[str, Any] = {}
        env = dict(self.env)
        if self.device == "cpu":  # no GPU: the watchdog's path exercised with a fake reader of healthy readings
            fake = self.work / "fake_nvml.json"
            fake.write_text(json.dumps({"gpus": [{"index": 0, "util": 95}]}))
            env["CKPT_FAKE_NVML"] = str(fake)
        from ckpt_tool.supervise.gpu_monitor import open_reader

        reader, why = open_reader(env)
        if reader is None:
            return False, f"no GPU reader: {why}", figures
        samples, t0 = [], time.perf_counter()
        for _ in range(20):
            samples.append(reader.sample())
        figures["reading_ms"] = round((time.perf_counter() - t0) / 20 * 1000, 3)
        reader.close()
        last = samples[-1]
        figures["gpus"] = {i: {"util": s.util, "memory_used": s.memory_used, "ecc_uncorrected": s.ecc_uncorrected} for i, s in last.items()}
        d = self.work / "nvml"
        d.mkdir()
        args = recipe_args(d / "ckpt", d / "metrics.jsonl", self.sizes.nvml_steps, 10**6, *FAST_ARGS, "--device", self.device)
        rc = self.sh(ckpt_run_command(1, d / "run", args, ()), d / "log.txt", env=env)
        events = [json.loads(line) for line in (d / "run" / "events.jsonl").read_text().splitlines()] if (d / "run").exists() else []
        names = [e.get("event") for e in events]
        start = next((e for e in events if e.get("event") == "start"), {})
        figures.update(ckpt_run_exit=rc, gpu_monitor=start.get("gpu_monitor"), gpu_errors=names.count("gpu_error"))
        ok = rc == 0 and bool(last) and names.count("gpu_error") == 0 and start.get("gpu_monitor") == "NVML"
        return (
            ok,
            f"{len(last)} GPU(s) read, {figures['reading_ms']} ms a reading; ckpt run exit {rc}, monitor {start.get('gpu_monitor')}, gpu_error events: {names.count('gpu_error')}",
            figures,
        )

    def cpu_side(self) -> tuple[bool, str, dict[str, Any]]:
        ckpt = self.work / "gpt_exact_sync" / "reference" / "ckpt"
        if not ckpt.exists():
            return False, f"no checkpoint to check: {ckpt} (gpt_exact_sync did not run)", {}
        env = {**self.env, "CUDA_VISIBLE_DEVICES": ""}  # the CPU side: no GPU visible
        ckpt_bin = [sys.executable, "-m", "ckpt_tool.cli.main"]
        verify = subprocess.run([*ckpt_bin, "verify", str(ckpt), "--json"], capture_output=True, text=True, env=env, timeout=180)
        out = self.work / "export.safetensors"
        export = subprocess.run(
            [*ckpt_bin, "export", str(ckpt), "--out", str(out), "--json"], capture_output=True, text=True, env=env, timeout=180
        )
        figures = {
            "verify_exit": verify.returncode,
            "export_exit": export.returncode,
            "export_bytes": out.stat().st_size if out.exists() else 0,
        }
        if verify.returncode != 0 or export.returncode != 0:
            figures["stderr"] = (verify.stderr[-1200:], export.stderr[-1200:])
        try:
            report = json.loads(verify.stdout)
            figures["verify_exact"], figures["differences"] = report.get("exact"), report.get("differences")
        except ValueError:
            pass
        ok = verify.returncode == 0 and export.returncode == 0
        return ok, f"verify exit {verify.returncode} (exact: {figures.get('verify_exact')}), export exit {export.returncode}", figures

    def all(self) -> None:
        s = self.sizes
        self.run_step("imports", self.imports)
        self.run_step(
            "gpt_exact_async",
            lambda: self.exact("gpt_exact_async", GPT, [*FAST_ARGS, "--async-save"], s.gpt_steps, s.gpt_crash_at, s.gpt_save_every),
        )
        self.run_step(
            "gpt_exact_sync", lambda: self.exact("gpt_exact_sync", GPT, list(FAST_ARGS), s.gpt_steps, s.gpt_crash_at, s.gpt_save_every)
        )
        self.run_step("wrong_numbers", self.wrong_numbers)
        self.run_step("cnn_exact_amp", lambda: self.exact("cnn_exact_amp", CNN, ["--amp"], s.cnn_steps, s.cnn_crash_at, 4))
        self.run_step("big_save", self.big_save)
        self.run_step("fast_tier", self.fast_tier)
        self.run_step("nvml", self.nvml)
        self.run_step("cpu_side", self.cpu_side)


# ----------------------------------------------------------------------------- inner measurements (own process)
def disk_of(path: Path) -> str:
    """The filesystem ``path`` is on, from /proc/mounts: device, type, mount point, free space."""
    best = ("?", "?", "/")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best[2]):
                best = (dev, fstype, mnt)
    except OSError:
        pass
    free = shutil.disk_usage(path).free / common.GB
    return f"{best[0]} ({best[1]}) at {best[2]}, {free:.0f} GB free"


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _compute(device: Any, n: int, steps: int) -> float:
    """Seconds of ``steps`` matmuls of n x n on ``device`` (the stand-in for training compute)."""
    import torch

    x = torch.randn(n, n, device=device)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        x = torch.tanh(x @ x)
    _sync(device)
    return time.perf_counter() - t0


def inner_big_save(device_type: str, sizes: Sizes, out: Path) -> dict[str, Any]:
    import torch

    device = torch.device(device_type)
    model = common.build_model(sizes.state_gb * common.GB).to(device)
    opt = common.make_optimizer(model)
    nbytes = common.state_nbytes(model)
    timer = common.PhaseTimer({"staging_wait": ("save.staging_wait",), "async_start": ("save.async_start",), "write": ("save.write",)})
    steps = 20
    _compute(device, sizes.matmul, 3)  # warm-up
    idle = _compute(device, sizes.matmul, steps)
    with timer.listening():
        mgr = common.manager(out / "async", model, opt, async_save=True)
        t0 = time.perf_counter()
        mgr.save(1)
        call = time.perf_counter() - t0
        mgr.wait_for_staging()
        blocked = time.perf_counter() - t0
        busy = _compute(device, sizes.matmul, steps)  # while the background write runs
        mgr.wait()
        async_total = time.perf_counter() - t0
        mgr.close()
        async_phases = timer.take()
        sync_mgr = common.manager(out / "sync", model, opt, async_save=False)
        t0 = time.perf_counter()
        sync_mgr.save(1)
        sync_s = time.perf_counter() - t0
        sync_mgr.close()
    files = common.files_under(out / "sync" / "step_00000001")
    evicted = common.evict(files)
    fresh = common.build_model(sizes.state_gb * common.GB, seed=7).to(device)
    load_mgr = common.manager(out / "sync", fresh, common.make_optimizer(fresh))
    t0 = time.perf_counter()
    step = load_mgr.resume()
    _sync(device)
    load_s = time.perf_counter() - t0
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))
    load_mgr.close()
    host = [p.detach().cpu() for p in model.parameters()]
    raw_path = out / "raw.bin"
    t0 = time.perf_counter()
    common.raw_write(raw_path, [memoryview(t.numpy()).cast("B") for t in host])
    raw_write_s = time.perf_counter() - t0
    common.evict([raw_path])
    t0 = time.perf_counter()
    common.raw_read([raw_path])
    raw_read_s = time.perf_counter() - t0
    gb = nbytes / common.GB
    figures = {
        "state_gb": round(gb, 3),
        "disk": disk_of(out),
        "eviction": evicted,
        "async_save_call_s": round(call, 4),
        "async_blocked_s": round(blocked, 4),
        "async_total_s": round(async_total, 3),
        "async_phases_s": {k: round(v, 4) for k, v in async_phases.items()},
        "compute_idle_s": round(idle, 4),
        "compute_during_write_s": round(busy, 4),
        "compute_lost_s": round(busy - idle, 4),
        "sync_save_s": round(sync_s, 3),
        "save_gbps": round(gb / sync_s, 3),
        "raw_write_gbps": round(gb / raw_write_s, 3),
        "cold_load_s": round(load_s, 3),
        "load_gbps": round(gb / load_s, 3),
        "raw_read_gbps": round(gb / raw_read_s, 3),
        "resumed_step": step,
        "loaded_equal": same,
    }
    ok = step == 1 and same
    detail = (
        f"{gb:.2f} GB: async blocked {blocked:.3f} s (sync {sync_s:.2f} s), compute lost {busy - idle:.3f} s; "
        f"save {gb / sync_s:.2f} GB/s (raw {gb / raw_write_s:.2f}), cold load {gb / load_s:.2f} GB/s (raw {gb / raw_read_s:.2f}); {figures['disk']}"
    )
    return {"ok": ok, "detail": detail if ok else f"resume gave step {step}, state equal: {same}; " + detail, **figures}


def inner_fast_tier(device_type: str, sizes: Sizes, out: Path) -> dict[str, Any]:
    import torch

    device = torch.device(device_type)
    local = Path(tempfile.mkdtemp(prefix="gpu-check-local-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        gb = sizes.state_gb / 4
        model = common.build_model(gb * common.GB).to(device)
        opt = common.make_optimizer(model)
        # shared tier at step 2, fast tier at step 3: a resume that finds step 3 read the fast tier
        tiers = {"save_every": 2, "local_every": 3, "local_dir": local}
        mgr = common.manager(out / "shared", model, opt, **tiers)
        mgr.maybe_save(1)
        mgr.maybe_save(2)
        mgr.wait()
        t0 = time.perf_counter()
        mgr.maybe_save(3)
        mgr.wait_for_staging()
        blocked = time.perf_counter() - t0
        mgr.wait()
        mgr.close(final=False)  # no final shared save of step 3: only the fast tier holds it
        fresh = common.build_model(gb * common.GB, seed=7).to(device)
        again = common.manager(out / "shared", fresh, common.make_optimizer(fresh), **tiers)
        t0 = time.perf_counter()
        step = again.resume()
        _sync(device)
        resume_s = time.perf_counter() - t0
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))
        again.close()
    finally:
        shutil.rmtree(local, ignore_errors=True)
    real_gb = common.state_nbytes(model) / common.GB
    figures = {"state_gb": round(real_gb, 3), "local_dir": str(local), "blocked_s": round(blocked, 4), "local_resume_s": round(resume_s, 3)}
    ok = step == 3 and same
    return {
        "ok": ok,
        "detail": f"{real_gb:.2f} GB to {local.parent}: blocked {blocked:.3f} s; local resume of step {step} in {resume_s:.2f} s, state equal: {same}",
        **figures,
    }


# ----------------------------------------------------------------------------- report
def markdown(meta: dict[str, Any], steps: list[Step]) -> str:
    lines = [
        f"# GPU check, {meta['date']}",
        "",
        f"torch {meta['torch']}, device {meta['device_name']}, mode {meta['mode']}, {meta['seconds']} s; "
        f"{sum(s.ok for s in steps)}/{len(steps)} steps passed.",
        "",
        "| step | result | seconds | detail |",
        "| --- | --- | --- | --- |",
    ]
    for s in steps:
        lines.append(f"| {s.name} | {'pass' if s.ok else 'FAIL'} | {s.seconds} | {s.detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when there is one, else nothing measured")
    p.add_argument("--tiny", action="store_true", help="every step at its smallest size (to exercise the script)")
    p.add_argument("--out", type=Path, default=Path("gpu-check-out"), help="where gpu-check.json, gpu-check.md and the runs go")
    p.add_argument("--work", type=Path, help="where the runs go (default OUT/runs; on the GPU machine a folder outside $OUT)")
    p.add_argument("--budget-s", type=float, default=330.0, help="no step starts after this many seconds")
    p.add_argument("--inner", choices=("big_save", "fast_tier"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = TINY if args.tiny else FULL
    if args.inner:
        fn = inner_big_save if args.inner == "big_save" else inner_fast_tier
        print(json.dumps(fn(args.device, sizes, args.out)))
        return 0
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else ""
    if not device:
        print("no CUDA device: nothing measured (python bench/gpu_check.py --device cpu --tiny exercises every step on the CPU)")
        return 0
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device visible; nothing measured", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / "runs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    check = Check(device, sizes, args.out, work, args.budget_s)
    check.all()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "mode": "tiny" if args.tiny else "full",
        "seconds": round(time.monotonic() - t0, 1),
    }
    (args.out / "gpu-check.json").write_text(json.dumps({**meta, "steps": [asdict(s) for s in check.steps]}, indent=2, default=str))
    (args.out / "gpu-check.md").write_text(markdown(meta, check.steps))
    print(markdown(meta, check.steps))
    print(f"gpu_check: wrote {args.out / 'gpu-check.json'} and {args.out / 'gpu-check.md'}")
    return 0 if all(s.ok for s in check.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
