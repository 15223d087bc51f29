"""Shared fixtures: running the reference recipe under real torchrun (2 ranks, gloo, FSDP2), and a
real small filesystem to fill."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ckpt_tool.recipes.launch import FAST_ARGS, read_metrics, recipe_args, run, torchrun_command

STEPS = 40
SAVE_EVERY = 5

# Every resume in the tests takes the cooperative load (each byte read once, sent to the ranks that
# need it), though the ranks share one machine (where its default, cooperative only across nodes,
# would leave it off): the exactness tests run through it. Inherited by every torchrun launched.
os.environ.setdefault("CKPT_COOPERATIVE_LOAD", "1")


class Recipe:
    """Runs the reference recipe in ``root``: same arguments every time, like a restarted job."""

    def __init__(
        self,
        root: Path,
        nproc: int = 2,
        steps: int = STEPS,
        save_every: int = SAVE_EVERY,
        extra: tuple[str, ...] = (),
        ckpt_dir: Path | None = None,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = ckpt_dir or root / "ckpt"
        self.metrics = root / "metrics.jsonl"
        self.log = root / "log.txt"
        self.nproc = nproc
        self.args = recipe_args(self.ckpt_dir, self.metrics, steps, save_every, *FAST_ARGS, *extra)

    @property
    def command(self) -> list[str]:
        return torchrun_command(self.nproc, self.args)

    def run(self, timeout: float = 300) -> int:
        return run(self.command, self.log, timeout=timeout)

    def run_until_done(self, max_attempts: int = 5) -> int:
        """Restart after each crash, as a supervisor would; returns the number of attempts."""
        for attempt in range(1, max_attempts + 1):
            if self.run() == 0:
                return attempt
        raise AssertionError(f"recipe did not finish in {max_attempts} attempts; log:\n{self.log.read_text()[-4000:]}")

    def metrics_lines(self):
        return read_metrics(self.metrics)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Recipe:
    """One uninterrupted run of the recipe (sync saves), shared by the exact-resume tests."""
    recipe = Recipe(tmp_path_factory.mktemp("reference"))
    assert recipe.run() == 0, recipe.log.read_text()[-4000:]
    return recipe


@pytest.fixture(scope="session")
def recipe_checkpoints(tmp_path_factory) -> Path:
    """A checkpoint directory of the recipe (2 ranks): steps 5, 10, 15, 20. Copy it before changing it."""
    recipe = Recipe(tmp_path_factory.mktemp("recipe-ckpts"), steps=20, save_every=5, extra=("--keep-last", "4"))
    assert recipe.run() == 0, recipe.log.read_text()[-3000:]
    return recipe.ckpt_dir


@pytest.fixture
def small_tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """``mount(path, size)``: a tmpfs of ``size`` (``"2m"``, ``"24k"``) mounted at ``path``, a real
    disk to fill; unmounted after the test. Skips without root."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a size-limited tmpfs needs root")
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextmanager
def read_only_view(src: Path, at: Path) -> Iterator[Path]:
    """``src`` seen read-only at ``at`` (a bind mount, remounted read-only; root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    at.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(at)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(at)], check=True)
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=False)
