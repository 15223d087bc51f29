"""The directory lock: released by a holder's death, reported when held, soft where flock fails."""

from __future__ import annotations

import errno
import fcntl
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore

from ..integration.test_store import commit

pytestmark = pytest.mark.faults


def no_flock(fd, op):
    """fcntl.flock as on NFS mounted without locking."""
    raise OSError(errno.ENOLCK, "No locks available")


def hold_lock(root) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        from ckpt_tool.store.store import CheckpointStore
        with CheckpointStore({str(root)!r}).changing():
            print("held", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_lock_is_reported_and_a_dead_holders_lock_is_free(tmp_path):
    store = CheckpointStore(tmp_path / "c", create=True)
    holder = hold_lock(store.root)
    try:
        with pytest.raises(CkptError) as err, store.changing(timeout=0.5):
            pass
        assert err.value.exit_code == ExitCode.CONFLICT and "held by another process" in err.value.message
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: the kernel releases an flock
        holder.wait()
    t0 = time.monotonic()
    commit(store, 10)
    assert time.monotonic() - t0 < 5 and store.read_latest() == 10


def test_without_working_flock_a_soft_lock_still_serialises_writers(tmp_path, monkeypatch, caplog):
    # The quick stand-in: fake the one syscall that fails on NFS without locking (ENOLCK). The real one,
    # a FUSE filesystem on which the kernel's flock() fails, is tests/faults/test_nolock_fs.py.
    monkeypatch.setattr(fcntl, "flock", no_flock)
    store = CheckpointStore(tmp_path / "c", create=True)
    with caplog.at_level("WARNING", logger="ckpt_tool"), store.changing():
        assert (store.root / ".lock.soft").exists()  # the lease file, not an flock, holds it
        assert any("flock does not work" in r.message for r in caplog.records)
        with pytest.raises(CkptError, match="held by another process"), CheckpointStore(store.root).changing(timeout=0.3):
            pass  # a second writer waits for the first
    commit(store, 10)
    assert store.read_latest() == 10 and not (store.root / ".lock.soft").exists()
