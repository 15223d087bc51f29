"""Running the reference recipe under torchrun and comparing its metrics (demo, tests, benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ckpt_tool.supervise.processes import kill_tree as _kill_tree

# A small, fast configuration of the recipe for tests and the demo (about 0.1 s a step on 2 CPU ranks).
FAST_ARGS = ("--d-model", "64", "--n-layer", "2", "--corpus-tokens", "60000")


def torchrun_command(nproc: int, recipe_args: Sequence[str], module: str = "ckpt_tool.recipes.tiny_gpt") -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", module, *recipe_args]


def recipe_args(ckpt_dir: Path, metrics: Path, steps: int, save_every: int, *extra: str) -> list[str]:
    return ["--ckpt-dir", str(ckpt_dir), "--metrics", str(metrics), "--steps", str(steps), "--save-every", str(save_every), *extra]


def run(cmd: Sequence[str], log: Path | None = None, timeout: float = 600, env: Mapping[str, str] | None = None) -> int:
    """Run to completion in its own session; output to ``log``; returns the exit code."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "ab") if log is not None else open(os.devnull, "wb") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=full_env, start_new_session=True).returncode


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, like a power cut."""
    _kill_tree([pid])


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    lr: float
    grad_norm: float


def read_metrics(path: Path) -> list[StepMetrics]:
    """Every line, in order (a step re-run after a crash appears again)."""
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out.append(StepMetrics(int(d["step"]), float(d["loss"]), float(d["lr"]), float(d["grad_norm"])))
    return out


@dataclass(frozen=True)
class Comparison:
    steps_compared: int
    lines_compared: int
    mismatches: tuple[tuple[StepMetrics, StepMetrics | None], ...]
    missing_steps: tuple[int, ...]

    @property
    def identical(self) -> bool:
        return not self.mismatches and not self.missing_steps


def compare_runs(reference: Iterable[StepMetrics], candidate: Iterable[StepMetrics]) -> Comparison:
    """Bit-for-bit: every line of ``candidate`` (re-run steps included) equals the reference's step."""
    ref = {m.step: m for m in reference}
    cand = list(candidate)
    mismatches = tuple((m, ref.get(m.step)) for m in cand if ref.get(m.step) != m)
    missing = tuple(sorted(set(ref) - {m.step for m in cand}))
    return Comparison(len({m.step for m in cand}), len(cand), mismatches, missing)
