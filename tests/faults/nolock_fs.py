"""A FUSE passthrough filesystem on which flock() and fcntl() locks fail with ENOLCK, like NFS without lockd.

    python tests/faults/nolock_fs.py BACKING MOUNTPOINT

Runs in the foreground until unmounted (``fusermount3 -u MOUNTPOINT`` or ``umount MOUNTPOINT``) or sent
SIGTERM/SIGINT (which unmount too); on Linux its parent's death sends it SIGTERM, so a test run killed
before its clean-up leaves no mount behind. Every file operation goes to BACKING. The ``flock`` and
``lock`` operations exist, so libfuse asks the kernel for FUSE_CAP_FLOCK_LOCKS and FUSE_CAP_POSIX_LOCKS
and the kernel sends FUSE_SETLK instead of locking locally; they answer ENOLCK, so flock(2) and fcntl(2)
locks themselves fail, as on an NFS mount without locking. Needs mfusepy and libfuse 3 (Debian: fuse3).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
from ctypes.util import find_library

# mfusepy looks for libfuse 2 first; prefer 3 where it is installed (the one .ci/fuse-up-if-possible installs).
if not os.environ.get("FUSE_LIBRARY_PATH") and not os.environ.get("FUSE_LIBRARY_NAME") and find_library("fuse3"):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

import mfusepy as fuse

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize")
STATVFS_KEYS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")


class NoLockFS(fuse.Operations):
    use_ns = True  # times in integer nanoseconds (getattr and utimens)

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)

    def _path(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    # ------------------------------------------------------------- the point of this filesystem
    def flock(self, path, fh, op):
        raise fuse.FuseOSError(errno.ENOLCK)

    def lock(self, path, fh, cmd, lock):
        raise fuse.FuseOSError(errno.ENOLCK)

    # ------------------------------------------------------------- passthrough
    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        attrs = {key: getattr(st, key) for key in STAT_KEYS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def access(self, path, amode):
        if not os.access(self._path(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        return {key: getattr(st, key) for key in STATVFS_KEYS}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._path(path))]

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)
        return 0

    def rmdir(self, path):
        os.rmdir(self._path(path))
        return 0

    def unlink(self, path):
        os.unlink(self._path(path))
        return 0

    def rename(self, old, new):
        os.rename(self._path(old), self._path(new))
        return 0

    def link(self, target, source):  # mfusepy's order: the new name first
        os.link(self._path(source), self._path(target))
        return 0

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self._path(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        if times is None:
            os.utime(self._path(path))
        else:
            os.utime(self._path(path), ns=times)
        return 0

    def truncate(self, path, length, fh=None):
        os.truncate(self._path(path), length)
        return 0

    def create(self, path, mode, flags):
        return os.open(self._path(path), flags | os.O_CREAT, mode)

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0

    def fsyncdir(self, path, datasync, fh):
        fd = os.open(self._path(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    backing, mountpoint = argv
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    try:
        fuse.FUSE(NoLockFS(backing), mountpoint, foreground=True, fsname="nolock_fs", subtype="nolock_fs")
    except RuntimeError as exc:  # libfuse's status: mount failed, or a signal ended the loop (after unmounting)
        print(f"nolock_fs: libfuse returned {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
