"""The package emits its documented timing spans on the real paths (one process, no torchrun):
a save, a resume, a validation and the one-process reshard copy; and the fsync the save span
times comes after the last bytes of each file were handed to the OS."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tool import timing
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.hashing_fs import hashing_writer
from ckpt_tool.training.validation import validate_checkpoint

from .tiny import make_trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def trained(directory: Path, **config):
    trainer = make_trainer(directory, save_every=0, **config)
    trainer.step()
    return trainer


def test_a_sync_save_emits_the_save_spans(tmp_path):
    trainer = trained(tmp_path / "c")
    with timing.record() as totals:
        trainer.manager.save(1)
    trainer.manager.close()
    counts = totals.counts()
    seconds = totals.take()
    expected = {"state_dict.build_optimizer", "state_dict.get", "save.write", "save.fsync", "save.commit", "store.commit"}
    assert expected <= set(seconds), f"missing: {expected - set(seconds)}"
    assert "save.async_start" not in seconds
    assert counts["save.fsync"] >= 2  # every file DCP wrote (data files and .metadata), each fsynced once
    assert seconds["save.write"] > 0 and seconds["store.commit"] > 0


def test_an_async_save_emits_its_start_and_the_wait_for_the_upload(tmp_path):
    trainer = trained(tmp_path / "c", async_save=True)
    with timing.record("save.async_start", "save.upload_wait", "save.fsync", "store.commit") as totals:
        trainer.manager.save(1)
        trainer.manager.wait()
    trainer.manager.close()
    assert set(totals.take()) == {"save.async_start", "save.upload_wait", "save.fsync", "store.commit"}


def test_a_resume_and_a_validation_emit_the_load_and_check_spans(tmp_path):
    first = trained(tmp_path / "c")
    first.manager.save(1)
    first.manager.close()
    again = make_trainer(tmp_path / "c", seed=7, save_every=0)
    with timing.record() as totals:
        assert again.manager.resume() == 1
    again.manager.close()
    seconds = totals.take()
    expected = {
        "resume.crash_cleanup",
        "resume.structure_check",
        "resume.load",
        "load.dcp",
        "load.read_file",
        "state_dict.get",
        "state_dict.set",
        "store.read_manifest",
    }
    assert expected <= set(seconds), f"missing: {expected - set(seconds)}"
    assert "validate.dcp_metadata" not in seconds  # the resume's structure check leaves .metadata to the load: read once

    with timing.record("store.hash_files", "store.read_manifest", "validate.dcp_metadata") as totals:
        assert validate_checkpoint(CheckpointStore(tmp_path / "c"), 1, threads=2).ok
    assert set(totals.take()) == {"store.hash_files", "store.read_manifest", "validate.dcp_metadata"}


def test_the_one_process_reshard_copy_emits_its_load_write_and_commit(tmp_path):
    from ckpt_tool.core.batch import BatchConfig
    from ckpt_tool.entrypoints.reshard_copy import reshard_in_one_process
    from ckpt_tool.training.config import CheckpointConfig
    from ckpt_tool.training.manager import CheckpointManager

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = CheckpointManager(
        CheckpointConfig(tmp_path / "src"), model=model, optimizer=optimizer, batch=BatchConfig(micro_batch=4, grad_accum=1, dp_size=1)
    )
    manager.save(1)
    manager.close()
    with timing.record("reshard.load", "reshard.write", "reshard.commit", "load.read_file") as totals:
        reshard_in_one_process(tmp_path / "src", 1, tmp_path / "out", 2, 1, None, 2)
    assert set(totals.take()) == {"reshard.load", "reshard.write", "reshard.commit", "load.read_file"}
    assert CheckpointStore(tmp_path / "out").read_manifest(1).world_size == 2


def test_every_file_the_save_writes_is_whole_on_disk_when_it_is_fsynced(tmp_path, monkeypatch):
    """DCP fsyncs a file before its stream's last flush: the ``.metadata`` (pickled into a
    buffered stream) was fsynced with 0 bytes on disk, its bytes written after. The hashing
    filesystem fsyncs after the flush (the ``save.fsync`` span); os.fsync is observed here, at
    the OS boundary, to see how much of each file the kernel had when it was asked to sync."""
    sizes_at_fsync: dict[str, list[int]] = {}
    real_fsync = os.fsync

    def observed(fd: int) -> None:
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        sizes_at_fsync.setdefault(name, []).append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", observed)
    writer, fs = hashing_writer(tmp_path, "run", 1, 2)
    state = {"model": {"w": torch.randn(64, 8), "b": torch.randn(3)}, "optim": {"lr": 0.1, "step": 3}}
    with fs.writers_settled():
        dcp.save(state, storage_writer=writer, no_dist=True)
    monkeypatch.setattr(os, "fsync", real_fsync)
    written = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert ".metadata" in written and len(written) >= 2, written
    for name, size in written.items():
        synced = sizes_at_fsync.get(name) or sizes_at_fsync.get(name + ".tmp")
        assert synced, f"{name} was never fsynced ({sorted(sizes_at_fsync)})"
        assert max(synced) == size, f"{name}: {synced} bytes on disk when fsynced, {size} in the end"


if sys.platform != "linux":  # /proc/self/fd
    test_every_file_the_save_writes_is_whole_on_disk_when_it_is_fsynced = pytest.mark.skip("needs /proc")(
        test_every_file_the_save_writes_is_whole_on_disk_when_it_is_fsynced
    )
