"""The recipes' --device (recipes.device): the choice on plain data, and --device cuda on a
machine without CUDA as a user sees it (exit 2, the cause and what to pass, nothing on disk)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_tool.recipes.device import pick_device


def test_auto_takes_cuda_when_there_is_one_and_the_cpu_otherwise() -> None:
    assert pick_device("auto", True) == ("cuda", None)
    assert pick_device("auto", False) == ("cpu", None)
    assert pick_device("cpu", True) == ("cpu", None)
    assert pick_device("cuda", True) == ("cuda", None)


def test_cuda_without_cuda_says_why_and_what_to_pass() -> None:
    device, why = pick_device("cuda", False)
    assert device is None and why is not None
    assert "--device cuda: this process sees no CUDA device" in why and "use --device cpu, or --device auto" in why


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("recipe", ["ckpt_tool.recipes.tiny_gpt", "ckpt_tool.recipes.tiny_cnn"])
def test_a_recipe_asked_for_cuda_without_cuda_exits_2_before_anything_starts(recipe: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            recipe,
            "--ckpt-dir",
            str(tmp_path / "c"),
            "--steps",
            "3",
            "--metrics",
            str(tmp_path / "m"),
            "--device",
            "cuda",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "error: --device cuda: this process sees no CUDA device" in done.stderr and "use --device cpu" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "m").exists()
