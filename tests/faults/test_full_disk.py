"""A checkpoint directory on a small tmpfs that fills during a save (a real ENOSPC)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore

from ..integration.tiny import make_trainer

pytestmark = [pytest.mark.faults, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path, leave: int) -> Path:
    """Fill the filesystem up to ``leave`` free bytes."""
    filler = mnt / "filler"
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


@pytest.mark.parametrize("async_save", [False, True])
def test_full_disk_gives_a_clear_error_and_loses_nothing(small_fs, async_save):
    ckpt = small_fs / "ckpt"
    t = make_trainer(ckpt, async_save=async_save)
    t.step()
    t.manager.save(1)
    t.manager.wait()
    store = CheckpointStore(ckpt)
    assert store.read_latest() == 1
    params = [p.detach().clone() for p in t.model.parameters()]
    filler = fill(small_fs, leave=4096)
    with pytest.raises(CkptError) as err:
        t.manager.save(2)
        t.manager.wait()  # async: the failure surfaces at the next wait or save
    assert "no space left on device" in err.value.message and str(ckpt) in err.value.message
    assert "bytes free" in err.value.message and "a checkpoint takes about" in err.value.message
    assert "step 1" in err.value.hint and "intact" in err.value.hint
    assert store.read_latest() == 1 and store.check_files(1).ok  # the previous checkpoint is intact
    assert not store.partial_path(2).exists()  # partial files removed
    assert all(torch.equal(a, b) for a, b in zip(params, t.model.parameters(), strict=True))  # training state untouched
    filler.unlink()
    t.step()
    t.manager.save(3)  # space is back: saving works again
    t.manager.close()
    assert store.read_latest() == 3 and store.check_files(3).ok


def test_continue_mode_logs_and_trains_on(small_fs, caplog):
    ckpt = small_fs / "ckpt"
    t = make_trainer(ckpt, on_save_error="continue")
    t.step()
    t.manager.save(1)
    fill(small_fs, leave=4096)
    with caplog.at_level("ERROR", logger="ckpt_tool"):
        t.manager.save(2)  # no exception
    assert any("no space left on device" in r.message and "training continues" in r.message for r in caplog.records)
    t.step()
    t.manager.close()
    assert CheckpointStore(ckpt).read_latest() == 1


def test_read_only_filesystem_is_a_clear_error(small_fs):
    ckpt = small_fs / "ckpt"
    t = make_trainer(ckpt)
    t.step()
    t.manager.save(1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    try:
        with pytest.raises(CkptError) as err:
            t.manager.save(2)
        assert "Read-only file system" in err.value.message and "step 1" in err.value.hint
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    assert CheckpointStore(ckpt).read_latest() == 1


def test_vanished_directory_is_not_recreated(tmp_path):
    ckpt = tmp_path / "ckpt"
    t = make_trainer(ckpt)
    t.step()
    t.manager.save(1)
    ckpt.rename(tmp_path / "moved")
    with pytest.raises(CkptError, match="vanished"):
        t.manager.save(2)
    assert not ckpt.exists()
    (tmp_path / "moved").rename(ckpt)
    t.manager.save(3)
    t.manager.close()
    assert CheckpointStore(ckpt).read_latest() == 3
