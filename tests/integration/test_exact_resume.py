"""Exact resume under real torchrun: crashed-and-resumed runs equal the uninterrupted run bit for bit."""

from __future__ import annotations

import pytest

from ckpt_tool.recipes.launch import compare_runs
from ckpt_tool.store.store import CheckpointStore

from ..conftest import STEPS, Recipe

pytestmark = pytest.mark.slow

CASES = {
    # name: (recipe arguments, attempts, LATEST right after the first crash, steps re-run after crashes)
    "before-first-save": (("--crash-at-step", "3"), 2, {None}, 2),
    "right-after-a-save": (("--crash-at-step", "11"), 2, {10}, 0),
    # step 10's save is slowed down (only it: the others need not wait) so the crash comes during it
    "mid-async-save": (("--async-save", "--save-delay", "4", "--save-delay-at", "10", "--crash-at-step", "12"), 2, {5}, 6),
    # a sync save killed between writing its files and committing them: LATEST stays on 5, steps 6-10 again
    "mid-sync-save": (("--crash-in-save-at", "10"), 2, {5}, 5),
    # each crash may come before or after the preceding async commit: the re-run count varies
    "two-crashes-async": (("--async-save", "--crash-at-step", "7", "--crash-at-step", "33"), 3, {None, 5}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_crashed_and_resumed_run_is_bit_identical(reference_run, tmp_path, case):
    extra, attempts, latest_after_crash, rerun = CASES[case]
    recipe = Recipe(tmp_path, extra=extra)
    assert recipe.run() != 0  # the first attempt dies of SIGKILL
    store = CheckpointStore(recipe.ckpt_dir)
    # mid-async-save: step 10's save was still in flight at the crash, so LATEST stayed on 5.
    assert store.read_latest() in latest_after_crash
    assert recipe.run_until_done() == attempts - 1
    comparison = compare_runs(reference_run.metrics_lines(), recipe.metrics_lines())
    assert comparison.identical, comparison.mismatches[:3]
    assert comparison.steps_compared == STEPS
    if rerun is not None:  # re-run steps were compared too
        assert comparison.lines_compared == STEPS + rerun
    else:
        assert comparison.lines_compared in {STEPS + first + second for first in (1, 6) for second in (2, 7)}
    assert store.read_latest() == STEPS and store.check_files(STEPS).ok
