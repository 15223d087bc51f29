"""The checkpoint store: one checkpoint directory on a (shared) filesystem.

Owns every side effect on the directory's own files: the commit (manifest last, fsync, atomic
rename, LATEST, index), quarantine, retention deletes and the clean-up of what a crash left.
All pointer moves and deletions happen under the directory's lock. Finding the newest committed
checkpoint reads LATEST (constant time); only clean-up and retention list the directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import psutil
from filelock import BaseFileLock, FileLock, SoftFileLease, Timeout

from ckpt_tool.core import layout
from ckpt_tool.core.index import IndexEvent, format_event, parse_index
from ckpt_tool.core.listing import Row, build_rows
from ckpt_tool.core.manifest import Manifest
from ckpt_tool.core.ownership import Owner, decide, same_claim
from ckpt_tool.core.retention import RetentionPolicy, steps_to_delete
from ckpt_tool.core.validation import DiskEntry, Problem, hash_problems, structure_problems
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.checksums import hash_files
from ckpt_tool.store.durable import append_line, atomic_write, current_umask, fsync_dir

log = logging.getLogger("ckpt_tool")
MAX_MANIFEST_BYTES = 64 << 20
LOCK_TIMEOUT_S = 120.0
# Where flock does not work, the lock is a lease its holder renews every third of this: a lock
# left by a process that died (on any host) is taken over once it has not changed for this long.
# Every writer of a directory must agree on it, so it is a constant, not a setting.
SOFT_LOCK_LEASE_S = 30.0


@dataclass(frozen=True)
class ValidationResult:
    step: int
    problems: tuple[Problem, ...]
    manifest: Manifest | None

    @property
    def ok(self) -> bool:
        return not self.problems


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


def commit_summary(manifest: Manifest) -> dict[str, object]:
    """What ``ckpt list`` shows of a checkpoint, kept in the index so listing reads no manifest."""
    return {
        "step": manifest.step,
        "bytes": manifest.total_bytes,
        "run_id": manifest.run_id,
        "world_size": manifest.world_size,
        "global_batch": manifest.batch.global_batch if manifest.batch is not None else None,
        "probe_loss": manifest.probe.loss if manifest.probe is not None else None,
        "created_at": manifest.created_at,
    }


class CheckpointStore:
    def __init__(self, root: Path | str, create: bool = False) -> None:
        self.root = Path(root)
        self._flock_works: bool | None = None
        self._claimed_as: Owner | None = None  # the claim this process made (claim())
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CkptError(
                    f"cannot create checkpoint directory {self.root}: {exc.strerror}",
                    "pass a --ckpt-dir on a writable filesystem",
                    ExitCode.USAGE,
                ) from None
        else:
            try:
                os.listdir(self.root)
            except PermissionError:
                raise CkptError(
                    f"permission denied reading checkpoint directory {self.root}",
                    "run as the user who owns it, or ask them to grant read access (the directory and its parents)",
                    ExitCode.USAGE,
                ) from None
            except (FileNotFoundError, NotADirectoryError):
                raise CkptError(
                    f"checkpoint directory {self.root} does not exist",
                    "check the path; a training run creates it on its first save",
                    ExitCode.NOT_FOUND,
                ) from None

    # ----------------------------------------------------------------- paths and lock
    def step_path(self, step: int) -> Path:
        return self.root / layout.step_dir_name(step)

    def partial_path(self, step: int) -> Path:
        return self.root / layout.partial_dir_name(step)

    @property
    def quarantine_root(self) -> Path:
        return self.root / layout.QUARANTINE_NAME

    def lock(self, timeout: float = LOCK_TIMEOUT_S) -> BaseFileLock:
        """The directory's lock: an flock, or filelock's soft lease (exclusive creation of a
        marker file that records pid and host, renewed by a heartbeat) where the filesystem has no
        working flock (NFS mounted without locking). A dead holder's lease is taken over at once
        on its own host, after ``SOFT_LOCK_LEASE_S`` unchanged from another host."""
        path = self.root / layout.LOCK_NAME
        mode = 0o644 & ~current_umask()  # filelock chmods the lock file to `mode`: apply the umask
        if self._flock_works is None:
            self._flock_works = flock_works(path, mode)
            if not self._flock_works:
                log.warning("ckpt: flock does not work on %s (NFS without locking?): using a soft lock file with a %.0f s lease; a lock left by a crashed holder on another host is taken over after that", self.root, SOFT_LOCK_LEASE_S)
        if self._flock_works:
            return FileLock(path, timeout=timeout, mode=mode)
        return SoftFileLease(path.with_suffix(".soft"), timeout=timeout, lease_duration=SOFT_LOCK_LEASE_S)

    def _locked(self, timeout: float = LOCK_TIMEOUT_S) -> BaseFileLock:
        lock = self.lock(timeout)
        try:
            lock.acquire()
        except Timeout:
            raise CkptError(
                f"the lock {self.root / layout.LOCK_NAME} is held by another process for more than {timeout:.0f} s",
                "another save, prune or rollback is running on this directory; retry when it ends",
                ExitCode.CONFLICT,
            ) from None
        return lock

    # ----------------------------------------------------------------- pointer and index
    def read_latest(self) -> int | None:
        """The step LATEST names; None when there is no LATEST yet. Raises on garbage."""
        path = self.root / layout.LATEST_NAME
        try:
            raw = path.read_bytes()[:256]
        except FileNotFoundError:
            return None
        try:
            return layout.parse_pointer(raw.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise CkptError(
                f"{path} is damaged: {exc}",
                "run `ckpt rollback --auto` to point it at the newest valid checkpoint",
                ExitCode.FAILED,
            ) from None

    def _write_latest(self, step: int) -> None:
        atomic_write(self.root / layout.LATEST_NAME, layout.format_pointer(step).encode())

    def append_event(self, event: str, **data: object) -> None:
        append_line(self.root / layout.INDEX_NAME, format_event(event, time.time(), **data))

    def events(self) -> list[IndexEvent]:
        try:
            with open(self.root / layout.INDEX_NAME, encoding="utf-8", errors="replace") as f:
                return parse_index(f)
        except FileNotFoundError:
            return []

    # ----------------------------------------------------------------- reading checkpoints
    def read_manifest(self, step: int) -> Manifest:
        path = self.step_path(step) / layout.MANIFEST_NAME
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            raise CkptError(
                f"{path} is missing: step {step} was never committed or is damaged",
                "run `ckpt validate` and `ckpt rollback` to move to a complete checkpoint",
                ExitCode.FAILED,
            ) from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise CkptError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes", "the manifest is damaged or hostile: quarantine it with `ckpt rollback`")
        manifest = Manifest.from_json(raw, where=str(path))
        if manifest.step != step:
            raise CkptError(
                f"{path} describes step {manifest.step}, not {step}: the manifest was copied from another checkpoint",
                "run `ckpt rollback` to move to a consistent checkpoint",
            )
        return manifest

    def list_entries(self, step: int) -> dict[str, DiskEntry]:
        entries = {}
        with os.scandir(self.step_path(step)) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                entries[e.name] = DiskEntry(st.st_size, e.is_file(follow_symlinks=False))
        return entries

    def validate(
        self,
        step: int,
        ranks: set[int] | None = None,
        threads: int | None = None,
        on_bytes: Callable[[int], None] | None = None,
        hashes: bool = True,
    ) -> ValidationResult:
        """Structure and content hashes of one checkpoint; ``ranks`` limits hashing to those ranks'
        files; ``hashes=False`` checks structure only (a loader that hashes as it reads)."""
        try:
            manifest = self.read_manifest(step)
        except CkptError as exc:
            return ValidationResult(step, (Problem(layout.MANIFEST_NAME, "unreadable manifest", "valid manifest", exc.message),), None)
        problems = structure_problems(manifest.files, self.list_entries(step))
        broken = {p.file for p in problems}
        to_hash = [f for f in manifest.files if hashes and f.path not in broken and (ranks is None or f.rank in ranks)]
        digests = hash_files(self.step_path(step), [f.path for f in to_hash], manifest.run_id, step, threads, on_bytes)
        problems += hash_problems(manifest.files, {d.name: d.hash for d in digests})
        return ValidationResult(step, tuple(problems), manifest)

    def committed_on_disk(self) -> list[int]:
        """Step directories holding a manifest (a directory listing: not for the hot path)."""
        steps = []
        for entry in self._scan():
            if entry.kind is layout.EntryKind.STEP and (self.root / entry.name / layout.MANIFEST_NAME).is_file():
                steps.append(entry.step)
        return sorted(steps)

    def step_dirs(self) -> list[int]:
        """Every ``step_N`` directory, committed or not (a manifest may be missing or damaged)."""
        return sorted(e.step for e in self._scan() if e.kind is layout.EntryKind.STEP)

    def rows(self) -> list[Row]:
        """``ckpt list``: one directory listing plus the index; manifests only for steps the
        index does not describe (an index lost or truncated)."""
        entries = list(self._scan())
        committed = [e.step for e in entries if e.kind is layout.EntryKind.STEP and (self.root / e.name / layout.MANIFEST_NAME).is_file()]
        events = self.events()
        known = {e.step for e in events if e.event == "commit"}
        summaries = {}
        for step in set(committed) - known:
            try:
                summaries[step] = commit_summary(self.read_manifest(step))
            except CkptError:
                pass
        quarantined = []
        if self.quarantine_root.is_dir():
            for name in sorted(os.listdir(self.quarantine_root)):
                step = layout.parse_step_dir_name(name.split(".")[0])
                if step is not None:
                    quarantined.append((step, name))
        partial = [e.step for e in entries if e.kind is layout.EntryKind.PARTIAL]
        return build_rows(committed, partial, quarantined, events, self.latest_or_none(), summaries)

    def record_check(self, step: int, kind: str, ok: bool, problems: list[str]) -> None:
        """Record a validation or verification result in the index (``validated`` / ``verified``)."""
        self.append_event(kind, step=step, ok=ok, problems=problems[:20])

    def _scan(self) -> Iterator[layout.DirEntry]:
        with os.scandir(self.root) as it:
            for e in it:
                parsed = layout.parse_entry(e.name)
                if parsed is not None and e.is_dir(follow_symlinks=False):
                    yield parsed

    # ----------------------------------------------------------------- ownership
    def claim(self, me: Owner, stale_after_s: float, take_over: bool) -> str:
        """Become the directory's writer, or raise naming the job that is (see core.ownership)."""
        path = self.root / layout.OWNER_NAME
        lock = self._locked()
        try:
            current = self._read_owner()
            alive = None
            if current is not None and current.host == me.host:
                alive = psutil.pid_exists(current.pid)
            decision = decide(current, me, time.time(), stale_after_s, alive, take_over)
            if not decision.allowed:
                raise CkptError(
                    f"{self.root} is being written by {decision.reason}",
                    "two jobs must not share a checkpoint directory: wait for it, use another --ckpt-dir, or take over (take_over=True) if it is dead",
                    ExitCode.CONFLICT,
                )
            atomic_write(path, json.dumps(me.to_json()).encode())
            if current is None or current.pid != me.pid or current.host != me.host:
                self.append_event("owner", job_id=me.job_id, host=me.host, pid=me.pid, reason=decision.reason)
            self._claimed_as = me
            return decision.reason
        finally:
            lock.release()

    def _read_owner(self) -> Owner | None:
        """The recorded owner; None when there is none or the record is damaged."""
        try:
            return Owner.from_json(json.loads((self.root / layout.OWNER_NAME).read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def refresh_owner(self, me: Owner) -> None:
        """Say the owner is alive (``last_seen``); raises when another job took the directory over."""
        lock = self._locked()
        try:
            self._check_still_owner()
            atomic_write(self.root / layout.OWNER_NAME, json.dumps(me.to_json()).encode())
        finally:
            lock.release()

    def _check_still_owner(self) -> None:
        """Under the lock: after a claim, refuse to write once another job has taken over (it
        judged this one stale, or was told to take over). No claim made here: nothing to check."""
        if self._claimed_as is None:
            return
        current = self._read_owner()  # None: removed by hand or damaged, nobody else claims it
        if current is not None and not same_claim(current, self._claimed_as):
            raise CkptError(
                f"{self.root} was taken over by {current.describe(time.time())}; this job no longer writes there",
                "two jobs must not share a checkpoint directory: stop this one, or give it another directory",
                ExitCode.CONFLICT,
            )

    # ----------------------------------------------------------------- writing
    def commit(self, step: int, manifest: Manifest) -> Path:
        """Make the staged ``.step_N.partial`` the committed ``step_N`` and point LATEST at it.

        The manifest is written last into the staging directory (temp + fsync + rename), the
        directory is fsynced and renamed, the parent fsynced; then LATEST moves and the index
        records the commit, all under the lock. A crash at any instant leaves LATEST on a
        complete checkpoint.
        """
        partial = self.partial_path(step)
        atomic_write(partial / layout.MANIFEST_NAME, manifest.to_json().encode())
        target = self.step_path(step)
        lock = self._locked()
        try:
            self._check_still_owner()
            if target.exists():
                # A directory of the same step that LATEST never named: left by a crash between
                # rename and pointer move, or a run that went further before a rollback.
                self._move_to_quarantine(step, "superseded by a new save of the same step")
            os.rename(partial, target)
            fsync_dir(self.root)
            self._write_latest(step)
            self.append_event("commit", **commit_summary(manifest))
        finally:
            lock.release()
        return target

    def _move_to_quarantine(self, step: int, reason: str) -> Path:
        self.quarantine_root.mkdir(exist_ok=True)
        dest = self.quarantine_root / f"{layout.step_dir_name(step)}.{time.time_ns()}"
        os.rename(self.step_path(step), dest)
        fsync_dir(self.root)
        self.append_event("quarantine", step=step, reason=reason, moved_to=str(dest.relative_to(self.root)))
        return dest

    def quarantine(self, step: int, reason: str) -> Path:
        lock = self._locked()
        try:
            return self._move_to_quarantine(step, reason)
        finally:
            lock.release()

    def set_latest(self, step: int, reason: str, event: str = "rollback") -> None:
        lock = self._locked()
        try:
            if not (self.step_path(step) / layout.MANIFEST_NAME).is_file():
                raise CkptError(f"step {step} has no committed checkpoint in {self.root}", "pick a step shown by `ckpt list`", ExitCode.NOT_FOUND)
            previous = self.latest_or_none()
            self._write_latest(step)
            self.append_event(event, step=step, previous=previous, reason=reason)
        finally:
            lock.release()

    def latest_or_none(self) -> int | None:
        """LATEST's step, or None when it is missing or damaged (recovery paths only)."""
        try:
            return self.read_latest()
        except CkptError:
            return None

    def apply_retention(self, policy: RetentionPolicy, dry_run: bool = False) -> list[int]:
        """Delete what the policy allows, only ever after a commit. Each delete is renamed
        aside first, so a crash never leaves a half-deleted ``step_N``."""
        lock = self._locked()
        try:
            latest = self.read_latest()
            victims = steps_to_delete(self.committed_on_disk(), latest, policy)
            if dry_run or latest is None:
                return victims if latest is not None else []
            for step in victims:
                doomed = self.root / layout.deleting_dir_name(step)
                os.rename(self.step_path(step), doomed)
                self.append_event("delete", step=step, reason=f"retention {policy}")
            fsync_dir(self.root)
        finally:
            lock.release()
        for step in victims:
            shutil.rmtree(self.root / layout.deleting_dir_name(step), ignore_errors=True)
        return victims

    def clean_up_after_crash(self, roll_forward: Callable[[int], bool] | None = None) -> list[str]:
        """Remove staging and half-deleted directories; settle committed-but-unpointed ones.

        A ``step_N`` newer than LATEST (a crash between rename and pointer move) is rolled
        forward when ``roll_forward(step)`` says it is valid, else quarantined.
        Returns a line per action.
        """
        actions = []
        lock = self._locked()
        try:
            latest = self.latest_or_none()
            for entry in sorted(self._scan(), key=lambda e: e.step):
                path = self.root / entry.name
                if entry.kind in (layout.EntryKind.PARTIAL, layout.EntryKind.DELETING):
                    shutil.rmtree(path, ignore_errors=True)
                    self.append_event("cleanup", name=entry.name, reason=f"{entry.kind.value} directory left by a crash")
                    actions.append(f"removed {entry.name} (left by a crash)")
                elif (latest is None or entry.step > latest) and (path / layout.MANIFEST_NAME).is_file():
                    if roll_forward is not None and roll_forward(entry.step):
                        self._write_latest(entry.step)
                        self.append_event("roll_forward", step=entry.step, previous=latest)
                        actions.append(f"LATEST moved forward to {entry.name} (committed, pointer not yet moved at the crash)")
                        latest = entry.step
                    else:
                        self._move_to_quarantine(entry.step, "newer than LATEST and not valid")
                        actions.append(f"quarantined {entry.name} (newer than LATEST, not valid)")
        finally:
            lock.release()
        return actions
