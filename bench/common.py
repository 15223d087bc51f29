"""Helpers shared by the checkpoint benchmarks (one script per figure in this directory).

Model construction, the raw I/O references (write + fsync, sequential read), page-cache
eviction, timing statistics, phases from the package's timing spans (``ckpt_tool.timing``, the
one seam a figure times the package through), and the result format: every script prints one
JSON object on the last line of stdout, which ``run_all.py`` collects.

GB = 1e9 bytes throughout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GB = 1e9
MB = 1e6
DEFAULT_WORK_DIR = Path("/tmp/ckpt-bench")
READ_CHUNK = 8 << 20  # the chunk size ckpt_tool's hashing reads with


# ----------------------------------------------------------------------------- arguments
def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work-dir", type=Path, default=DEFAULT_WORK_DIR, help=f"scratch directory, deleted at the end (default {DEFAULT_WORK_DIR})"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions (a smoke test, not a measurement)")
    return parser


@contextmanager
def scratch_dir(work_dir: Path, name: str) -> Iterator[Path]:
    """``work_dir/name``, emptied first and removed at the end (``work_dir`` too when left empty)."""
    path = work_dir / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        try:
            work_dir.rmdir()
        except OSError:
            pass  # not empty: another script's scratch, or run_all's


# ----------------------------------------------------------------------------- model
def build_model(state_bytes: float, layers: int = 16, seed: int = 0) -> Any:
    """``layers`` square fp32 ``nn.Linear`` layers totalling about ``state_bytes`` of parameters.

    Initialisation writes every parameter, so the memory is touched (warm) before any timing.
    """
    import torch
    from torch import nn

    width = max(64, int(math.sqrt(state_bytes / 4 / layers)) // 64 * 64)
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def make_optimizer(model: Any, grads: bool = True) -> Any:
    """SGD without momentum: the optimizer holds no state, the checkpoint is the parameters.

    ``grads``: give every parameter a (zero, warm) gradient, as after a backward pass. Without
    gradients, torch's ``get_state_dict`` initialises a stateless optimizer on every call
    (``zeros_like`` of every parameter + a step with lr=0), which costs time and memory that an
    optimizer with state (Adam) never pays; save_throughput.py measures that case separately.
    """
    import torch

    if grads:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.0)


@contextmanager
def without_grads(model: Any) -> Iterator[None]:
    """Parameters' gradients set to None inside the block, restored after."""
    saved = [(p, p.grad) for p in model.parameters()]
    for p, _ in saved:
        p.grad = None
    try:
        yield
    finally:
        for p, grad in saved:
            p.grad = grad


def state_nbytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def param_views(model: Any) -> list[memoryview]:
    """Byte views of the parameters' memory (no copy): the raw-write reference writes these."""
    return [memoryview(p.detach().numpy()).cast("B") for p in model.parameters()]


def manager(directory: Path, model: Any, optimizer: Any, **config: Any) -> Any:
    """A ``CheckpointManager`` on ``directory``; retention off unless ``retention=`` is given."""
    from ckpt_tool.core.retention import RetentionPolicy
    from ckpt_tool.training.config import CheckpointConfig
    from ckpt_tool.training.manager import CheckpointManager

    config.setdefault("retention", RetentionPolicy(keep_last=1_000_000))
    return CheckpointManager(CheckpointConfig(directory, **config), model=model, optimizer=optimizer)


def save_checkpoint(directory: Path, state_bytes: float, step: int = 1, seed: int = 1, **config: Any) -> tuple[Any, Path]:
    """One sync ``save(step)`` of a ``build_model(state_bytes)`` model through a manager on
    ``directory``; returns the model (the saved state) and the committed step directory."""
    model = build_model(state_bytes, seed=seed)
    mgr = manager(directory, model, make_optimizer(model), **config)
    mgr.save(step)
    mgr.close()
    return model, mgr.store.step_path(step)


# ----------------------------------------------------------------------------- commands
def ckpt_command(*args: str) -> list[str]:
    """The ``ckpt`` console script installed next to this interpreter (``.venv/bin/ckpt``), as a
    user runs it; ``python -m ckpt_tool.cli.main`` when there is none."""
    script = Path(sys.executable).parent / "ckpt"
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "ckpt_tool.cli.main", *args]


def time_command(cmd: Sequence[str], timeout_s: float = 600, cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of a command run to completion (interpreter start included), output captured;
    raises RuntimeError when it exits non-zero."""
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}: {proc.stderr[-1500:]}")
    return seconds, proc


def poll_until(done: Callable[[], Any], timeout: float, every: float = 0.01) -> Any:
    """``done()``'s first truthy value, polled every ``every`` seconds; None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(every)
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's records (a missing file: none; a torn or foreign line skipped)."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


# ----------------------------------------------------------------------------- the local SLURM cluster
def cluster_answers() -> bool:
    """Whether a SLURM cluster answers ``sinfo`` here."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def squeue_state(job_id: str) -> str:
    """The job's state in squeue (RUNNING, PENDING, COMPLETING...; "" once it is gone, "?" when squeue does not answer)."""
    try:
        return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=10).stdout.strip()
    except subprocess.TimeoutExpired:
        return "?"


# ----------------------------------------------------------------------------- raw I/O references
def raw_write(path: Path, buffers: Sequence[memoryview]) -> int:
    """Write ``buffers`` sequentially into a new file with ``os.write``, then ``os.fsync``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    try:
        for buf in buffers:
            view = buf
            while view:
                n = os.write(fd, view)
                view = view[n:]
                total += n
        os.fsync(fd)
    finally:
        os.close(fd)
    return total


def raw_read(paths: Iterable[Path], chunk: int = READ_CHUNK) -> int:
    """Read files sequentially, one thread, into one reused (warm) buffer; returns the bytes read."""
    buf = bytearray(chunk)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def raw_read_parallel(paths: Sequence[Path], threads: int, chunk: int = READ_CHUNK) -> int:
    """``raw_read`` of each file in a pool of ``threads`` threads (one file per task), as
    ckpt_tool's hashing reads; returns the bytes read."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
        return sum(pool.map(lambda p: raw_read([p], chunk), paths))


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def evict(paths: Iterable[Path], drop_all: bool = True) -> str:
    """Drop ``paths`` from the page cache; returns the method that worked.

    Each file is fsynced and ``POSIX_FADV_DONTNEED``-ed; then, as root and unless ``drop_all``
    is False, ``drop_caches=3`` (also drops dentries and inodes, as after a reboot or on another
    node; and every other file, e.g. the Python and torch libraries a new process loads).
    """
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    os.sync()
    if not drop_all:
        return "fadvise(DONTNEED)"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches=3 + fadvise(DONTNEED)"
    except OSError:
        return "fadvise(DONTNEED)"


def evict_checked(paths: Sequence[Path], drop_all: bool = True) -> tuple[str, int | None]:
    """``evict(paths, drop_all)``, then the bytes of ``paths`` still in the page cache (None: unknown)."""
    method = evict(paths, drop_all)
    return method, resident_bytes(paths)


def resident_bytes(paths: Iterable[Path]) -> int | None:
    """Bytes of ``paths`` in the page cache (util-linux ``fincore``); None when unavailable."""
    paths = [str(p) for p in paths]
    if not paths or shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *paths], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return sum(int(x) for x in out.stdout.split())


def settle() -> None:
    """Flush dirty pages so one timed run does not pay for the previous one's writeback."""
    os.sync()
    time.sleep(0.2)


# ----------------------------------------------------------------------------- timing
class MatmulLoop:
    """The stand-in for training in the async figures: 384x384 matmuls on torch's default threads."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.a, self.b = torch.randn(384, 384), torch.randn(384, 384)

    def rate(self, seconds: float) -> float:
        """Matmuls per second over ``seconds`` of computing."""
        done, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.torch.mm(self.a, self.b)
            done += 1
        return done / seconds

    def matmuls_until(self, finished: Callable[[], bool], slice_s: float) -> float:
        """Matmuls done while computing in slices of ``slice_s`` until ``finished()``."""
        done = 0.0
        while not finished():
            done += self.rate(slice_s) * slice_s
        return done


@dataclass(frozen=True)
class Stats:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        if not samples:
            raise ValueError("no samples")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def scaled(self, factor: float) -> Stats:
        """Every figure times ``factor`` (> 0): seconds -> milliseconds, bytes -> GB."""
        return Stats(self.median * factor, self.min * factor, self.max * factor, self.n)

    def inverse(self, numerator: float) -> Stats:
        """``numerator / x`` for each figure: seconds -> throughput (min and max swap)."""
        return Stats(numerator / self.median, numerator / self.max, numerator / self.min, self.n)

    def fmt(self, digits: int = 2, unit: str = "") -> str:
        unit = f" {unit}" if unit else ""
        if self.n == 1:
            return f"{self.median:.{digits}f}{unit}"
        return f"{self.median:.{digits}f}{unit} ({self.min:.{digits}f}-{self.max:.{digits}f}, n={self.n})"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


class PhaseTimer:
    """Thread-seconds per phase of a figure, from the package's documented timing spans
    (``ckpt_tool.timing``: no patching of the package). ``phases`` maps each phase label shown in
    BENCHMARKS.md to the span names it adds up; a span name that no longer exists fails at once
    (``ValueError`` from ``timing.record``). Spans from several threads add up (thread-seconds).

    ``with timer.listening():`` turns it on; ``take()`` returns the phases that ran since the last
    ``take()`` (a phase none of whose spans ran is absent) and starts again from zero.
    """

    def __init__(self, phases: dict[str, tuple[str, ...]]) -> None:
        from ckpt_tool import timing

        self.phases = phases
        self._timing = timing
        timing.check_names([name for names in phases.values() for name in names])
        self._totals: Any = None

    @contextmanager
    def listening(self) -> Iterator[None]:
        names = sorted({name for names in self.phases.values() for name in names})
        with self._timing.record(*names) as totals:
            self._totals = totals
            try:
                yield
            finally:
                self._totals = None

    def take(self) -> dict[str, float]:
        if self._totals is None:
            raise RuntimeError("PhaseTimer.take() outside listening()")
        spans = self._totals.take()
        return {label: sum(spans[n] for n in names if n in spans) for label, names in self.phases.items() if any(n in spans for n in names)}


def rotated_repetitions(
    run: Callable[[str], tuple[float, dict[str, float] | None]], variants: Sequence[str], reps: int, nbytes: int
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, float]]]]:
    """Every variant ``reps`` times, the order rotated each repetition so that page cache, CPU
    frequency and load drift fall evenly on all of them. ``run(variant)`` returns the seconds
    and, where it measured one, the phase split. Logs GB/s of ``nbytes`` per repetition."""
    times: dict[str, list[float]] = {v: [] for v in variants}
    phases: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for rep in range(reps):
        order = [*variants[rep % len(variants) :], *variants[: rep % len(variants)]]
        for variant in order:
            seconds, split = run(variant)
            times[variant].append(seconds)
            if split is not None:
                phases[variant].append(split)
        log(f"rep {rep + 1}/{reps}: " + ", ".join(f"{v}={nbytes / times[v][-1] / GB:.2f} GB/s" for v in variants))
    return times, phases


def median_run(times: Sequence[float], phases: Sequence[dict[str, float]]) -> tuple[float, dict[str, float]]:
    """The total and phase split of the repetition whose total is the median (lower middle for
    an even count), so that the phases add up to the total shown."""
    i = sorted(range(len(times)), key=times.__getitem__)[(len(times) - 1) // 2]
    return times[i], phases[i]


def phase_note(label: str, total: float, split: dict[str, float]) -> str:
    """``label: total s = phase s + ... + other s`` (other: the total less the phases shown)."""
    parts = " + ".join(f"{k} {v:.3f} s" for k, v in split.items())
    return f"{label}, {total:.3f} s = {parts} + other {total - sum(split.values()):.3f} s"


def median_phases(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    labels = sorted({k for s in samples for k in s})
    return {k: round(statistics.median(s.get(k, 0.0) for s in samples), 4) for k in labels}


# ----------------------------------------------------------------------------- memory
def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/self/clear_refs``); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5\n")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM: the peak resident set since the process started or since ``reset_peak_rss()``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class RssSampler:
    """Samples RSS every ``interval_s`` in a background thread and keeps the maximum."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            self.samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- results
@dataclass
class Row:
    """One line of a figure's table. ``met`` is None for rows shown for information only."""

    measured: str
    value: str
    reference: str = "-"
    ratio: float | None = None
    target: str = "-"
    met: bool | None = None


@dataclass
class Result:
    figure: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def emit(self) -> None:
        """Print the result as JSON on the last line of stdout."""
        sys.stdout.flush()
        print(json.dumps(asdict(self)), flush=True)


def at_least(ratio: float, bound: float) -> tuple[str, bool]:
    return f">= {bound:g}", ratio >= bound


def median_at_most(label: str, st: Stats, bound_s: float, reference: str = "", complete: bool = True) -> Row:
    """A row of seconds judged on the median against an upper bound, the max shown beside it
    (``complete``: False when some trials gave no value, which fails the row)."""
    shown = f"max {st.max:.2f} s" + (f"; {reference}" if reference else "")
    return Row(label, st.fmt(2, "s"), shown, round(st.median / bound_s, 3), f"median <= {bound_s:g} s", complete and st.median <= bound_s)


def at_most(ratio: float, bound: float) -> tuple[str, bool]:
    return f"<= {bound:g}", ratio <= bound


def run_json(cmd: Sequence[str], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a benchmark script in a fresh process (with ``env``, else this one's); its stderr passes
    through, the last stdout line is the result."""
    proc = subprocess.run(list(cmd), stdout=subprocess.PIPE, text=True, timeout=timeout_s, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; stdout tail: {lines[-5:]}")
    return json.loads(lines[-1])


def log(message: str) -> None:
    """Progress goes to stderr: stdout's last line is reserved for the JSON result."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class MetricsTail:
    """Stamps each new line of the metrics file (wall clock): from its own thread (``start``),
    or from a caller's poller (``poll``)."""

    def __init__(self, path: Path, interval_s: float = 0.005, probe: Callable[[], dict[str, float]] | None = None) -> None:
        self.path = path
        self.interval_s = interval_s
        self.probe = probe
        self.lines: list[tuple[int, float]] = []  # (step, time.time() when seen)
        self.cpu: list[dict[str, float]] = []  # probe() when each line was seen
        self._offset, self._partial = 0, b""
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-tail", daemon=True)

    def start(self) -> MetricsTail:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def poll(self) -> None:
        """Read what was appended since the last poll (the thread calls this every interval)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        now = time.time()
        if not data:
            return
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        steps = []
        for line in complete:
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a SIGKILL of rank 0
        if steps:
            cpu = self.probe() if self.probe is not None else {}
            with self._cond:
                self.lines += [(s, now) for s in steps]
                self.cpu += [cpu] * len(steps)
                self._cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def count(self) -> int:
        with self._cond:
            return len(self.lines)

    def wait_line(self, after: int, pred: Callable[[int], bool], timeout: float) -> tuple[int, float] | None:
        """The first line at index >= ``after`` whose step satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            i = after
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i][0]):
                        return self.lines[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def snapshot(self) -> list[tuple[int, float]]:
        with self._cond:
            return list(self.lines)

    def first(self, step: int) -> float | None:
        """When the line of ``step`` was first seen, or None."""
        with self._cond:
            return next((t for s, t in self.lines if s == step), None)
