"""bench/gpu_check.py: its CPU-skip form. Every step of it at tiny size on the CPU (~2 min) runs in
CI's GPU-check step (`.ci/run`: `make gpu-check GPU_CHECK_ARGS="--device cpu --tiny ..."`), not in
`make test`; a step that fails there fails CI."""

from __future__ import annotations

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
