"""Under plain torchrun the manager says, from rank 0, one line per commit and one per resume
(where from and why); ``quiet=True`` says nothing."""

from __future__ import annotations

import logging

import pytest

from ckpt_tool.recipes.launch import FAST_ARGS, recipe_args, run, torchrun_command

from .tiny import make_trainer


def lines(text: str, words: str) -> list[str]:
    return [line for line in text.splitlines() if words in line]


@pytest.mark.slow
def test_one_line_per_commit_and_per_resume_saying_from_where_and_why(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"

    def recipe(steps: int, name: str) -> str:
        log = tmp_path / f"{name}.txt"
        assert run(torchrun_command(2, recipe_args(ckpt, metrics, steps, 5, *FAST_ARGS)), log, timeout=300) == 0, log.read_text()[-3000:]
        return log.read_text()

    first = recipe(10, "first")
    assert lines(first, "ckpt: no checkpoint in") == [f"ckpt: no checkpoint in {ckpt}: starting from scratch"]
    for step in (5, 10):
        [line] = lines(first, f"ckpt: checkpoint step {step} committed: ")  # rank 0 only: once
        assert f"{ckpt}/step_{step:08d} (2.2 MB, " in line
    second = recipe(15, "second")
    assert lines(second, "ckpt: resumed from") == [f"ckpt: resumed from step 10 ({ckpt}/step_00000010): the newest valid checkpoint"]
    assert len(lines(second, "ckpt: checkpoint step 15 committed")) == 1
    damaged = next((ckpt / "step_00000015").glob("*.distcp"))
    with open(damaged, "r+b") as f:
        f.seek(100)
        f.write(b"XXXX")
    third = recipe(16, "third")
    assert lines(third, "ckpt: resumed from") == [
        f"ckpt: resumed from step 10 ({ckpt}/step_00000010): fell back past step 15 (damaged and quarantined, see above)"
    ]


def test_quiet_says_nothing_and_the_lines_are_records_of_the_progress_logger(tmp_path, caplog):
    for quiet in (False, True):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ckpt_tool.progress"):
            t = make_trainer(tmp_path / str(quiet), quiet=quiet)
            t.manager.resume()
            t.step()
            t.manager.save(1)
            t.manager.close()
        said = [r.message for r in caplog.records if r.name == "ckpt_tool.progress"]
        if quiet:
            assert said == []
        else:
            assert said[0].startswith("ckpt: no checkpoint in") and said[1].startswith("ckpt: checkpoint step 1 committed: ")
