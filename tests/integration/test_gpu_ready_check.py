"""bench/gpu_check.py: its CPU-skip form (what CI runs) and every step at tiny size on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would measure")
def test_without_cuda_the_check_measures_nothing_and_exits_0(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device: nothing measured" in done.stdout and "--device cpu --tiny" in done.stdout
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_every_step_passes_at_tiny_size_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "o"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out)], capture_output=True, text=True, timeout=540
    )
    report = json.loads((out / "gpu-check.json").read_text())
    failed = [(s["name"], s["detail"]) for s in report["steps"] if not s["ok"]]
    assert done.returncode == 0 and not failed, (failed, done.stderr[-3000:])
    names = [s["name"] for s in report["steps"]]
    assert names == ["imports", "gpt_exact_async", "gpt_exact_sync", "cnn_exact_amp", "big_save", "fast_tier", "nvml", "cpu_side"]
    assert "bit-identical" in report["steps"][1]["detail"] and "8/8 steps passed" in (out / "gpu-check.md").read_text()
