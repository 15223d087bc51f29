"""A checkpoint directory on a small tmpfs that fills during a save (a real ENOSPC)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore

from ..integration.tiny import make_trainer

pytestmark = [pytest.mark.faults, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def small_fs(tmp_path, small_tmpfs):
    return small_tmpfs(tmp_path / "mnt", "2m")


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
    t = make_trainer(ckpt, async_save=async_save, max_failed_saves=1)  # the first failure stops
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
    assert "no space left on device (ENOSPC)" in err.value.message and str(ckpt) in err.value.message
    assert " free" in err.value.message and "this save needed about" in err.value.message and "the size of step 1" in err.value.message
    assert "step 1" in err.value.hint and "intact" in err.value.hint and "ckpt prune" in err.value.hint
    assert err.value.exit_code == ExitCode.SAVE_FAILED
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
    assert any("no space left on device" in r.message and "Training continues WITHOUT this checkpoint" in r.message for r in caplog.records)
    t.step()
    t.manager.close()
    assert CheckpointStore(ckpt).read_latest() == 1


def test_read_only_filesystem_is_a_clear_error(small_fs):
    ckpt = small_fs / "ckpt"
    t = make_trainer(ckpt, on_save_error="stop")
    t.step()
    t.manager.save(1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    try:
        with pytest.raises(CkptError) as err:
            t.manager.save(2)
        assert "Read-only file system" in err.value.message and "[EROFS]" in err.value.message and "step 1" in err.value.hint
        assert err.value.exit_code == ExitCode.SAVE_FAILED
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    assert CheckpointStore(ckpt).read_latest() == 1


def test_vanished_directory_is_not_recreated(tmp_path):
    ckpt = tmp_path / "ckpt"
    t = make_trainer(ckpt, max_failed_saves=1)
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


def test_a_reshard_copy_onto_a_full_disk_fails_clearly_and_leaves_nothing(small_fs, tmp_path):
    import sys

    from ckpt_tool.core.batch import BatchConfig
    from ckpt_tool.training.config import CheckpointConfig
    from ckpt_tool.training.manager import CheckpointManager

    ckpt = tmp_path / "ckpt"
    model = torch.nn.Linear(64, 64)  # 16 KiB of parameters + 32 KiB of AdamW state: more than the 4 KiB left
    optimizer = torch.optim.AdamW(model.parameters())
    batch = BatchConfig(micro_batch=4, grad_accum=1, dp_size=1)
    manager = CheckpointManager(CheckpointConfig(ckpt), model=model, optimizer=optimizer, batch=batch)
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    manager.save(1)
    manager.close()
    before = sorted((p.name, p.stat().st_size) for p in CheckpointStore(ckpt).step_path(1).iterdir())
    filler = fill(small_fs, leave=4096)
    out = small_fs / "copy"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "reshard", str(ckpt), "--world-size", "2", "--out", str(out), "--one-process"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "writing the resharded copy" in proc.stderr and "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    assert "source checkpoint is unchanged" in " ".join(proc.stderr.split())
    assert not out.exists()  # nothing half-written left behind; the same --out works once there is space
    assert sorted((p.name, p.stat().st_size) for p in CheckpointStore(ckpt).step_path(1).iterdir()) == before
    filler.unlink()


def test_a_writer_threads_failure_reaches_the_commit_and_prints_no_traceback(tmp_path, capsys):
    """DCP's extra writer threads die with their error and dcp.save still returns; the filesystem
    keeps the error for the commit, which raises it (no checkpoint with a missing file)."""
    import threading

    from ckpt_tool.training.commit import staged_entries
    from ckpt_tool.training.hashing_fs import HashingFileSystem

    fs = HashingFileSystem(lambda name: 0)

    def write_into_a_missing_directory() -> None:
        with fs.create_stream(tmp_path / "gone" / "__1_0.distcp", "wb") as f:
            f.write(b"x")

    with fs.writers_settled():
        thread = threading.Thread(target=write_into_a_missing_directory, name="Thread-9 (_write_files_from_queue)")
        thread.start()
    assert not thread.is_alive()  # joined on the way out
    assert "Traceback" not in capsys.readouterr().err
    store = CheckpointStore(tmp_path / "ckpt", create=True)
    store.begin_staging(1)
    with pytest.raises(FileNotFoundError):
        staged_entries(store, 1, "run", fs, 0, b"{}")
