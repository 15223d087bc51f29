"""The lock of one checkpoint directory: an flock, or a renewed soft lease where flock fails.

flock is released by the kernel when its holder dies, on any filesystem that supports it. NFS
mounted without locking answers ENOLCK: there the lock is filelock's ``SoftFileLease``, a marker
file created exclusively that records pid and host and that its holder renews every third of
``SOFT_LOCK_LEASE_S``. A dead holder's lease is taken over at once on its own host, and from
another host once it has not changed for the lease.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from filelock import BaseFileLock, FileLock, SoftFileLease, Timeout

from ckpt_tool.core import layout
from ckpt_tool.errors import CkptError, ConflictError, ExitCode
from ckpt_tool.store.durable import current_umask

log = logging.getLogger("ckpt_tool")
LOCK_TIMEOUT_S = 120.0
# Every writer of a directory must agree on the lease, so it is a constant, not a setting.
SOFT_LOCK_LEASE_S = 30.0


def flock_works(path: Path, mode: int) -> bool:
    """Whether flock works on this filesystem (it fails with ENOLCK on NFS mounted with nolock)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    except OSError:
        return True  # cannot tell here; the lock itself will report the real error
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as exc:
        return exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
    finally:
        os.close(fd)


class DirectoryLock:
    """``acquire()`` returns the held lock (release it), or raises ``CkptError``: held by
    another process for longer than the timeout (exit 4), or a directory this user may not
    change (read-only, no permission: exit 2)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._flock_works: bool | None = None

    @property
    def soft(self) -> bool:
        """Whether this directory's lock is the soft lease (flock does not work here)."""
        return isinstance(self._lock(0), SoftFileLease)

    def _lock(self, timeout: float) -> BaseFileLock:
        path = self.root / layout.LOCK_NAME
        mode = 0o644 & ~current_umask()  # filelock chmods the lock file to `mode`: apply the umask
        if self._flock_works is None:
            self._flock_works = flock_works(path, mode)
            if not self._flock_works:
                log.warning(
                    "ckpt: flock does not work on %s (NFS without locking?): using a soft lock file with a %.0f s lease; a lock left by a crashed holder on another host is taken over after that",
                    self.root,
                    SOFT_LOCK_LEASE_S,
                )
        if self._flock_works:
            return FileLock(path, timeout=timeout, mode=mode)
        return SoftFileLease(path.with_suffix(".soft"), timeout=timeout, lease_duration=SOFT_LOCK_LEASE_S)

    def acquire(self, timeout: float = LOCK_TIMEOUT_S) -> BaseFileLock:
        """Take the directory's lock (flock, or the soft lease where flock fails), waiting up to ``timeout``
        seconds; the caller releases it. Raises ``CkptError``: CONFLICT when another process holds it
        that long, USAGE when the directory is read-only or not this user's (nothing changed)."""
        lock = self._lock(timeout)
        try:
            lock.acquire()
        except Timeout:
            raise ConflictError(
                f"the lock {self.root / layout.LOCK_NAME} is held by another process for more than {timeout:.0f} s",
                "another save, prune or rollback is running on this directory; retry when it ends",
                ExitCode.CONFLICT,
            ) from None
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise CkptError(
                f"cannot change {self.root}: {exc.strerror} (nothing was changed)",
                "run where the directory is writable, as its owner; the checks (list, validate, verify, --dry-run) work on a read-only directory",
                ExitCode.USAGE,
            ) from None
        return lock
