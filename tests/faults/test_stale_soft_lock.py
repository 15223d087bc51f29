"""A soft lock (where flock does not work) left by a process that died, here and on another host.

The holder is a real process that takes the directory's lock through ckpt_tool and is SIGKILLed
while holding it. "Another host" is a real one as far as the lock can tell: the holder runs in
its own UTS namespace with another host name (``unshare --uts``, root only), so the marker it
leaves names a host whose processes this one cannot see. flock is made to fail with ENOLCK in
both processes (NFS without locking; tests/faults/test_nolock_fs.py has the real filesystem).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ckpt_tool.errors import CkptError
from ckpt_tool.store import locks as locks_module
from ckpt_tool.store.store import CheckpointStore

from ..integration.test_store import commit
from .test_locks import no_flock

pytestmark = pytest.mark.faults

LEASE_S = 2.0  # every writer of a directory uses the same lease; short here to keep the test short


def needs_another_host_name() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to run the holder under another host name")


def hold_soft_lock(root, host: str | None) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import errno, fcntl, socket, time
        def no_flock(fd, op):
            raise OSError(errno.ENOLCK, "No locks available")
        fcntl.flock = no_flock
        from ckpt_tool.store import locks, store
        locks.SOFT_LOCK_LEASE_S = {LEASE_S}
        with store.CheckpointStore({str(root)!r}).changing():
            print("held", socket.gethostname(), flush=True)
            time.sleep(120)
    """)
    argv = [sys.executable, "-c", code]
    if host is not None:
        argv = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line[:1] == ["held"], line
    assert host is None or line[1] == host
    return proc


@pytest.fixture
def soft_store(tmp_path, monkeypatch):
    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(locks_module, "SOFT_LOCK_LEASE_S", LEASE_S)
    return CheckpointStore(tmp_path / "c", create=True)


def test_a_live_holder_on_another_host_keeps_the_lock_by_renewing_it(soft_store):
    needs_another_host_name()
    holder = hold_soft_lock(soft_store.root, "nodeB")
    marker = soft_store.root / ".lock.soft"
    try:
        taken = marker.stat()
        time.sleep(2 * LEASE_S)  # longer than the lease: only the holder's renewals keep it
        renewed = marker.stat()
        # the same marker (not one made again), touched by the holder since: a renewal, seen
        assert (renewed.st_ino, "host=nodeB" in marker.read_text()) == (taken.st_ino, True)
        assert renewed.st_mtime_ns - taken.st_mtime_ns >= LEASE_S * 1e9, (taken.st_mtime_ns, renewed.st_mtime_ns)
        with pytest.raises(CkptError, match="held by another process"), soft_store.changing(timeout=LEASE_S * 1.5):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_holders_lock_on_another_host_is_taken_over_after_the_lease(soft_store):
    needs_another_host_name()
    holder = hold_soft_lock(soft_store.root, "nodeB")
    holder.send_signal(signal.SIGKILL)  # dies holding it: nothing releases a soft lock
    holder.wait()
    marker = (soft_store.root / ".lock.soft").read_text()
    assert "host=nodeB" in marker, marker
    t0 = time.monotonic()
    commit(soft_store, 10)  # waits until the marker has not changed for a whole lease
    waited = time.monotonic() - t0
    assert soft_store.read_latest() == 10
    assert waited >= LEASE_S, "a foreign host's lock was broken before its lease ran out"
    assert not (soft_store.root / ".lock.soft").exists()


def test_a_dead_holders_lock_on_this_host_is_taken_over_at_once(soft_store):
    holder = hold_soft_lock(soft_store.root, None)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (soft_store.root / ".lock.soft").exists()
    t0 = time.monotonic()
    commit(soft_store, 10)  # the recorded pid is gone on this host: no need to wait the lease
    assert soft_store.read_latest() == 10
    assert time.monotonic() - t0 < LEASE_S
