"""Saves that fail on a real full disk (a small tmpfs): the training goes on with a warning,
retries at the next save, stops with exit code 78 after ``max_failed_saves`` in a row; LATEST
stays on a valid checkpoint; ``ckpt run`` does not restart on 78."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.recipes.launch import FAST_ARGS, read_metrics, recipe_args, run, torchrun_command
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.hashing_fs import HashingFileSystem

from ..integration.conftest import supervised  # noqa: F401 - the fixture
from ..integration.tiny import make_trainer
from .test_full_disk import fill

pytestmark = [pytest.mark.faults, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def small_fs(tmp_path, small_tmpfs):
    return small_tmpfs(tmp_path / "mnt", "2m")


def test_a_failed_write_inside_torch_save_is_the_os_error_with_its_file(small_fs):
    """torch.save into DCP's stream turns ENOSPC into "RuntimeError: unexpected pos", and DCP's
    gather of the ranks' failures keeps only that: the stream raises the OSError instead."""
    fill(small_fs, leave=64 * 1024)
    fs = HashingFileSystem(lambda name: 0)
    with pytest.raises(OSError) as err, fs.create_stream(small_fs / "__0_0.distcp", "wb") as stream:
        torch.save(torch.zeros(1_000_000), stream)
    assert err.value.errno == 28 and err.value.filename == str(small_fs / "__0_0.distcp")
    assert fs.write_failures == [err.value]


@pytest.mark.parametrize("async_save", [False, True])
def test_failed_saves_warn_and_train_on_then_stop_after_max_failed_saves(small_fs, async_save, caplog):
    ckpt = small_fs / "ckpt"
    t = make_trainer(ckpt, async_save=async_save, max_failed_saves=3)
    t.step()
    t.manager.save(1)
    t.manager.wait()
    store = CheckpointStore(ckpt)
    filler = fill(small_fs, leave=4096)
    with caplog.at_level(logging.WARNING, logger="ckpt_tool"):
        for step in (2, 3):
            t.step()
            t.manager.save(step)  # async: the failure of step 2 is noticed at save(3), of 3 at save(4)
        warnings = [r.message for r in caplog.records if "Training continues WITHOUT this checkpoint" in r.message]
        expected = 1 if async_save else 2
        assert len(warnings) == expected, caplog.text
        assert "saving step 2 failed: no space left on device (ENOSPC)" in warnings[0] and "failed save 1 of 3 in a row" in warnings[0]
        assert store.read_latest() == 1 and not store.partial_path(2).exists()
        t.step()
        with pytest.raises(CkptError) as err:
            t.manager.save(4)
            t.manager.save(5)  # async: save(5) notices the failure of step 4, the third in a row
    assert err.value.exit_code == ExitCode.SAVE_FAILED
    assert "stopping: 3 failed saves in a row (max_failed_saves=3)" in err.value.message and str(ckpt) in err.value.message
    assert "the previous checkpoint (step 1) is intact" in err.value.hint
    assert store.read_latest() == 1 and store.check_files(1).ok and store.committed_on_disk() == [1]
    assert not [p for p in ckpt.iterdir() if p.name.endswith(".partial")]
    filler.unlink()
    t.manager.close(final=False)


def test_a_commit_resets_the_count_and_a_failed_final_save_stops(small_fs, caplog):
    ckpt = small_fs / "ckpt"
    t = make_trainer(ckpt, max_failed_saves=3)
    t.step()
    t.manager.save(1)
    filler = fill(small_fs, leave=4096)
    t.step()
    t.manager.save(2)  # failure 1 of 3
    filler.unlink()
    t.step()
    t.manager.save(3)  # commits: the count starts again
    filler = fill(small_fs, leave=4096)
    t.step()
    t.manager.save(4)  # failure 1 of 3 again, not the second in a row
    assert t.manager.saver.failed_in_a_row == 1
    t.step()
    t.manager.maybe_save(5)  # not a save step (save_every=0): the final save at close, failure 2 of 3: it stops all the same
    with pytest.raises(CkptError) as err:
        t.manager.close()
    assert err.value.exit_code == ExitCode.SAVE_FAILED and "saving step 5 failed" in err.value.message
    assert "no later save would retry it" in err.value.message
    assert CheckpointStore(ckpt).read_latest() == 3
    filler.unlink()


def recipe_on_full_disk(root: Path, small_tmpfs, *extra: str) -> tuple[Path, list[str]]:
    """The recipe (2 ranks) with its checkpoints on a 3 MB tmpfs: step 5 (2.2 MB) fits, no later one."""
    ckpt = small_tmpfs(root / "ckpt", "3m")
    return ckpt, recipe_args(ckpt, root / "metrics.jsonl", 40, 5, *FAST_ARGS, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_torchrun_goes_on_past_failed_saves_then_stops_with_78_and_latest_valid(tmp_path, small_tmpfs, async_save):
    ckpt, args = recipe_on_full_disk(tmp_path, small_tmpfs, *(["--async-save"] if async_save else []))
    log = tmp_path / "log.txt"
    assert run(torchrun_command(2, args), log, timeout=300) != 0
    text = log.read_text()
    assert "CheckpointException" not in text, text[-3000:]
    assert "ckpt: WARNING: saving step 10 failed: no space left on device (ENOSPC) in " + str(ckpt) in text, text[-3000:]
    assert "failed save 2 of 3 in a row" in text and "this save needed about 2.2 MB (the size of step 5)" in text
    stop = "saving step 20 failed: no space left on device (ENOSPC)"
    assert f"rank 0: error: {stop}" in text and "stopping: 3 failed saves in a row" in text
    assert "exitcode: 78" in text  # torchrun's summary of the ranks
    steps = [m.step for m in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps[-1] == (25 if async_save else 20)  # trained on past the failures; async notices step 20's at save(25)
    store = CheckpointStore(ckpt)
    assert store.read_latest() == 5 and store.check_files(5).ok and store.committed_on_disk() == [5]
    assert sorted(p.name for p in ckpt.iterdir() if "partial" in p.name) == []


@pytest.mark.slow
def test_ckpt_run_stops_at_once_on_78_with_the_message(supervised, small_tmpfs):  # noqa: F811 - the fixture
    s = supervised("--max-failed-saves", "1", steps=40, save_every=5)
    small_tmpfs(s.ckpt, "3m")
    try:
        t0 = time.monotonic()
        assert s.run(timeout=300) == ExitCode.SAVE_FAILED, s.log_tail()
        assert time.monotonic() - t0 < 90
        events = s.events()
        [fatal] = [e for e in events if e["event"] == "fatal"]
        assert fatal["exit_code"] == 78 and "no space left on device (ENOSPC)" in fatal["message"], fatal
        assert not [e for e in events if e["event"] in ("restarted", "crash_loop")], events
        text = s.log.read_text()
        assert "saving step 10 failed: no space left on device (ENOSPC)" in text and "stopping" in text
        assert CheckpointStore(s.ckpt).read_latest() == 5
    finally:
        s.kill()
