"""The directory lock on a real filesystem where the kernel's flock() fails with ENOLCK (as on NFS without lockd).

nolock_fs.py is a FUSE passthrough filesystem whose flock and POSIX lock operations answer ENOLCK; the kernel
sends them FUSE_SETLK, so the syscalls fail for real, not through a monkeypatch. Needs /dev/fuse, libfuse 3
(Debian: fuse3, which .ci/fuse-up-if-possible installs) and mfusepy (the test extra). Skips without them;
under CI=true a missing prerequisite fails instead.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from ctypes.util import find_library
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.locks import flock_works
from ckpt_tool.store.store import CheckpointStore

from ..integration.test_store import commit

pytestmark = pytest.mark.faults

NOLOCK_FS = Path(__file__).with_name("nolock_fs.py")
MOUNT_TIMEOUT_S = 20


@dataclass(frozen=True)
class Mount:
    path: Path  # the FUSE mount: flock fails here
    backing: Path  # the directory it passes through to: flock works here


def unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}: .ci/fuse-up-if-possible should have made FUSE available")
    pytest.skip(reason)


def missing_prerequisite() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (a container needs --device /dev/fuse --cap-add SYS_ADMIN)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed (pip install -e '.[test]')"
    if not (find_library("fuse3") or find_library("fuse")):
        return "libfuse is not installed (apt-get install fuse3)"
    if os.geteuid() != 0 and not fusermount():
        return "not root and no fusermount3 to mount FUSE as a user"
    return None


def fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def is_mounted(path: Path) -> bool:
    with open("/proc/self/mounts") as f:  # the mount point field escapes space, tab, newline, backslash as \ooo
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1]) for line in f]
    return str(path) in points


def unmount(proc: subprocess.Popen, path: Path) -> None:
    tool = fusermount()
    if is_mounted(path):
        subprocess.run([tool, "-u", str(path)] if tool else ["umount", str(path)], capture_output=True, timeout=30)
    if is_mounted(path):  # busy (a file left open): detach it
        subprocess.run([tool, "-u", "-z", str(path)] if tool else ["umount", "-l", str(path)], capture_output=True, timeout=30)
    try:
        proc.wait(timeout=15)  # libfuse's loop ends once the mount is gone
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert not is_mounted(path), f"{path} is still mounted"


@pytest.fixture(scope="module")
def nolock_mount(tmp_path_factory) -> Iterator[Mount]:
    if reason := missing_prerequisite():
        unavailable(reason)
    base = tmp_path_factory.mktemp("nolock").resolve()  # /proc/mounts names the real path
    mount = Mount(base / "mnt", base / "backing")
    mount.path.mkdir()
    mount.backing.mkdir()
    log = base / "nolock_fs.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(NOLOCK_FS), str(mount.backing), str(mount.path)], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not is_mounted(mount.path):
        if proc.poll() is not None or time.monotonic() > deadline:
            unmount(proc, mount.path)
            unavailable(f"nolock_fs.py did not mount a FUSE filesystem (exit {proc.returncode}): {log.read_text()[-2000:]}")
        time.sleep(0.05)
    try:
        yield mount
    finally:
        unmount(proc, mount.path)


def test_flock_and_posix_locks_really_fail_with_enolck_on_the_mount(nolock_mount):
    fd = os.open(nolock_mount.path / "probe", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as err:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert err.value.errno == errno.ENOLCK
        with pytest.raises(OSError) as err:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert err.value.errno == errno.ENOLCK
    finally:
        os.close(fd)
    assert (nolock_mount.backing / "probe").exists()  # a real passthrough, not a fake path
    assert not flock_works(nolock_mount.path / ".lock", 0o644)
    assert flock_works(nolock_mount.backing / ".lock", 0o644)  # the refusal is the mount's, not the disk's


def test_on_the_mount_the_store_falls_back_to_a_soft_lock_that_serialises_writers(nolock_mount, caplog):
    store = CheckpointStore(nolock_mount.path / "c", create=True)
    with caplog.at_level("WARNING", logger="ckpt_tool"), store.changing():
        assert (store.root / ".lock.soft").exists()  # the lease file, not an flock, holds it
        assert any("flock does not work on" in r.getMessage() and str(store.root) in r.getMessage() for r in caplog.records)
        with pytest.raises(CkptError) as err, CheckpointStore(store.root).changing(timeout=0.3):
            pass  # a second writer waits for the first
        assert err.value.exit_code == ExitCode.CONFLICT and "held by another process" in err.value.message
    commit(store, 10)
    assert store.read_latest() == 10 and not (store.root / ".lock.soft").exists()
    assert (nolock_mount.backing / "c" / "LATEST").read_text() == "step_00000010\n"


def locker(root: Path, timeout: float) -> subprocess.Popen:
    """Another process that takes the store's lock, prints 'held', holds it until a line on stdin, releases."""
    code = textwrap.dedent(f"""
        import sys
        from ckpt_tool.errors import CkptError
        from ckpt_tool.store.store import CheckpointStore
        store = CheckpointStore({str(root)!r})
        try:
            with store.changing(timeout={timeout!r}):
                print("held", "soft" if (store.root / ".lock.soft").exists() else "flock", flush=True)
                sys.stdin.readline()
        except CkptError as exc:
            print("refused", exc.message, flush=True)
            sys.exit(3)
        print("released", flush=True)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def let_go(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "released"
    assert proc.wait(timeout=30) == 0


def test_on_the_mount_a_second_process_waits_for_the_first_ones_soft_lock(nolock_mount):
    store = CheckpointStore(nolock_mount.path / "d", create=True)
    procs = [first := locker(store.root, timeout=10)]
    try:
        assert first.stdout.readline().split() == ["held", "soft"]
        procs.append(second := locker(store.root, timeout=60))
        ready, _, _ = select.select([second.stdout], [], [], 1.5)
        assert not ready, f"the second process did not wait: {second.stdout.readline()!r}"
        refused = locker(store.root, timeout=0.5)
        procs.append(refused)
        out, _ = refused.communicate(timeout=30)
        assert refused.returncode == 3 and "held by another process" in out, out
        let_go(first)
        assert second.stdout.readline().split() == ["held", "soft"]  # only now
        let_go(second)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    commit(store, 20)
    assert store.read_latest() == 20 and not (store.root / ".lock.soft").exists()


def test_on_the_mount_a_killed_holders_soft_lock_is_taken_over(nolock_mount):
    store = CheckpointStore(nolock_mount.path / "e", create=True)
    holder = locker(store.root, timeout=10)
    try:
        assert holder.stdout.readline().split() == ["held", "soft"]
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: nothing releases a soft lock
        holder.wait()
    assert (store.root / ".lock.soft").exists()
    t0 = time.monotonic()
    commit(store, 30)  # its pid is gone on this host: taken over without waiting out the lease
    assert time.monotonic() - t0 < 10 and store.read_latest() == 30
    assert not (store.root / ".lock.soft").exists()
