"""Running the reference recipe and comparing its metrics: the one place the demo, the tests and
the benchmarks build its command lines, launch it (plain torchrun or under ``ckpt run``), find
its rank processes and read what it logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ckpt_tool.supervise.processes import kill_tree
from ckpt_tool.supervise.run_dir import read_events, read_ranks

RECIPE = "ckpt_tool.recipes.tiny_gpt"
# A small, fast configuration of the recipe for tests and the demo (about 0.1 s a step on 2 CPU ranks).
HANDOFF = "ckpt_tool.supervise.handoff"  # the launcher torchrun runs under ckpt run; not the rank
FAST_ARGS = ("--d-model", "64", "--n-layer", "2", "--corpus-tokens", "60000")


def torchrun_command(nproc: int, recipe_args: Sequence[str], module: str = RECIPE) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE ARGS`` (plain torchrun, no
    watchdog)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", module, *recipe_args]


def node_command(node_rank: int, nnodes: int, nproc: int, endpoint: str, recipe_args: Sequence[str], module: str = RECIPE) -> list[str]:
    """torchrun's agent for node ``node_rank`` of ``nnodes``, meeting at ``endpoint`` (host:port,
    static rendezvous: node i has ranks i*nproc..): several of them on one machine stand for
    several nodes (each with its own ``CKPT_LOCAL_DIR``)."""
    host, _, port = endpoint.rpartition(":")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={nproc}",
        f"--master-addr={host}",
        f"--master-port={port}",
        "-m",
        module,
        *recipe_args,
    ]


def ckpt_run_command(
    nproc: int, run_dir: Path, recipe_args: Sequence[str], run_opts: Sequence[str] = (), module: str = RECIPE
) -> list[str]:
    """``ckpt run --nproc-per-node N --run-dir DIR [OPTS] -- -m MODULE ARGS``."""
    return [
        sys.executable,
        "-m",
        "ckpt_tool.cli.main",
        "run",
        f"--nproc-per-node={nproc}",
        "--run-dir",
        str(run_dir),
        *run_opts,
        "--",
        "-m",
        module,
        *recipe_args,
    ]


def ckpt_submit_command(ckpt_dir: Path, recipe_args: Sequence[str], submit_opts: Sequence[str] = (), module: str = RECIPE) -> list[str]:
    """``ckpt submit --ckpt-dir DIR [OPTS] -- -m MODULE ARGS``."""
    return [
        sys.executable,
        "-m",
        "ckpt_tool.cli.main",
        "submit",
        "--ckpt-dir",
        str(ckpt_dir),
        *submit_opts,
        "--",
        "-m",
        module,
        *recipe_args,
    ]


def recipe_args(ckpt_dir: Path, metrics: Path, steps: int, save_every: int, *extra: str) -> list[str]:
    """The recipe's own arguments: checkpoint directory, metrics file, steps and save interval, then ``extra``."""
    return ["--ckpt-dir", str(ckpt_dir), "--metrics", str(metrics), "--steps", str(steps), "--save-every", str(save_every), *extra]


def run(cmd: Sequence[str], log: Path | None = None, timeout: float = 600, env: Mapping[str, str] | None = None) -> int:
    """Run to completion in its own session; output to ``log``; returns the exit code."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "ab") if log is not None else open(os.devnull, "wb") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=full_env, start_new_session=True).returncode


def recipe_ranks(root_pid: int, module: str = RECIPE, run_dir: Path | None = None) -> dict[int, psutil.Process]:
    """The live rank processes of the recipe below ``root_pid`` (torchrun or ``ckpt run``), by
    rank: from ``ckpt run``'s ``ranks.NODE.json`` in ``run_dir`` (a rank that started warm runs in a
    spare process whose environment ``ps`` cannot read), else by their RANK variable."""
    out: dict[int, psutil.Process] = {}
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    live = {p.pid: p for p in children if _running(p)}
    if run_dir is not None:
        out = {rank: live[pid] for rank, pid in read_ranks(run_dir).items() if pid in live}
        if out:
            return out
    for p in live.values():
        try:
            cmd = " ".join(p.cmdline())
            if module in cmd and "torch.distributed.run" not in cmd and HANDOFF not in cmd:
                out[int(p.environ()["RANK"])] = p
        except (psutil.Error, KeyError, ValueError):
            continue
    return out


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


class RecipeJob:
    """One launch of the recipe in ``root`` (``ckpt/``, ``metrics.jsonl``, ``run/``, ``log.txt``),
    under ``ckpt run`` (``supervised``) or plain torchrun, in its own session; ``module``: the
    recipe (the GPT one by default, with ``FAST_ARGS``)."""

    def __init__(
        self,
        root: Path,
        steps: int,
        save_every: int,
        extra: Sequence[str] = (),
        *,
        supervised: bool = True,
        run_opts: Sequence[str] = (),
        nproc: int = 2,
        module: str = RECIPE,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.supervised = root, supervised
        self.ckpt, self.metrics, self.run_dir, self.log = root / "ckpt", root / "metrics.jsonl", root / "run", root / "log.txt"
        fast = FAST_ARGS if module == RECIPE else ()  # the GPT recipe's small sizes
        args = recipe_args(self.ckpt, self.metrics, steps, save_every, *fast, *extra)
        self.argv = ckpt_run_command(nproc, self.run_dir, args, run_opts, module) if supervised else torchrun_command(nproc, args, module)
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self, env: Mapping[str, str] | None = None) -> RecipeJob:
        """Launch ``argv`` in a new session, output appended to ``log``, ``env`` over this process's environment;
        returns ``self`` without waiting."""
        with open(self.log, "ab") as log:
            self.started_at = time.time()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        return self

    def wait(self, timeout: float = 300) -> int:
        """The launch's exit code; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the job keeps
        running). Only after ``start``."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def run(self, timeout: float = 300) -> int:
        """``start`` then ``wait``: the exit code."""
        return self.start().wait(timeout)

    def ranks(self) -> dict[int, psutil.Process]:
        """The live rank processes by rank, now (see ``recipe_ranks``); empty when none runs. Only after ``start``."""
        assert self.proc is not None
        return recipe_ranks(self.proc.pid, run_dir=self.run_dir if self.supervised else None)

    def events(self) -> list[dict[str, Any]]:
        """The run directory's events so far (``ckpt run``'s; empty under plain torchrun)."""
        return read_events(self.run_dir)

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        """Until rank 0 logged ``step`` (or later); fails when the job ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.metrics.exists() and any(m.step >= step for m in read_metrics(self.metrics)):
                return
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached; {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of the launch's output (empty before it exists)."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the whole tree at once, like a power cut (nothing when it already ended)."""
        if self.proc is not None and self.proc.poll() is None:
            kill_tree([self.proc.pid])
            self.proc.wait()


@dataclass(frozen=True)
class StepMetrics:
    """One line of the recipe's metrics file: one optimizer step, floats at full precision (equal only when bit
    for bit)."""

    step: int
    loss: float
    lr: float
    grad_norm: float


def read_metrics(path: Path) -> list[StepMetrics]:
    """Every complete line, in order (a step re-run after a crash appears again; a last line
    cut by a SIGKILL of rank 0 is skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        out.append(StepMetrics(int(d["step"]), float(d["loss"]), float(d["lr"]), float(d["grad_norm"])))
    return out


@dataclass(frozen=True)
class Comparison:
    """``compare_runs``' verdict: distinct steps and lines of the candidate compared, each line that differs with
    the reference's line for its step (None when the reference has none), and reference steps the candidate
    never logged."""

    steps_compared: int
    lines_compared: int
    mismatches: tuple[tuple[StepMetrics, StepMetrics | None], ...]
    missing_steps: tuple[int, ...]

    @property
    def identical(self) -> bool:
        """True when no line differs and no step is missing."""
        return not self.mismatches and not self.missing_steps


def compare_runs(reference: Iterable[StepMetrics], candidate: Iterable[StepMetrics]) -> Comparison:
    """Bit-for-bit: every line of ``candidate`` (re-run steps included) equals the reference's step."""
    ref = {m.step: m for m in reference}
    cand = list(candidate)
    mismatches = tuple((m, ref.get(m.step)) for m in cand if ref.get(m.step) != m)
    missing = tuple(sorted(set(ref) - {m.step for m in cand}))
    return Comparison(len({m.step for m in cand}), len(cand), mismatches, missing)
