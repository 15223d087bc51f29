"""What resume() says when LATEST names a step that is not a committed checkpoint."""

from __future__ import annotations

import logging

import pytest

from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore

from .tiny import make_trainer


def saved(directory, steps):
    t = make_trainer(directory)
    for step in steps:
        t.step()
        t.manager.save(step)
    t.manager.close()
    return CheckpointStore(directory)


def test_latest_on_a_step_without_manifest_says_so_and_falls_back(tmp_path, caplog):
    store = saved(tmp_path / "c", [1, 2])
    manifest = store.step_path(2) / "ckpt_manifest.json"
    manifest.unlink()
    with caplog.at_level(logging.INFO, logger="ckpt_tool"):
        assert make_trainer(tmp_path / "c").manager.resume() == 1
    said = caplog.text
    assert f"LATEST in {store.root} names step 2, which is not a committed checkpoint: it has no manifest (damaged)" in said
    assert "falling back to step 1" in said and f"`ckpt validate {store.root} --all`" in said
    assert "names a missing checkpoint" not in said


def test_no_committed_step_left_names_what_is_there_and_what_to_run(tmp_path):
    store = saved(tmp_path / "c", [1])
    (store.step_path(1) / "ckpt_manifest.json").unlink()
    with pytest.raises(CkptError) as err:
        make_trainer(tmp_path / "c").manager.resume()
    assert err.value.exit_code == ExitCode.NOT_FOUND
    assert "names step 1, which is not a committed checkpoint: it has no manifest (damaged)" in err.value.message
    assert "no committed checkpoint is left in" in err.value.message
    assert f"`ckpt validate {store.root} --all`" in err.value.hint


def test_latest_on_a_step_that_is_gone_says_it_does_not_exist(tmp_path, caplog):
    store = saved(tmp_path / "c", [1, 2])
    store.step_path(2).rename(tmp_path / "elsewhere")
    with caplog.at_level(logging.WARNING, logger="ckpt_tool"):
        assert make_trainer(tmp_path / "c").manager.resume() == 1
    assert f"LATEST in {store.root} names step 2, which is not a committed checkpoint: its directory is missing" in caplog.text
