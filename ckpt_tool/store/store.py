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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import psutil
from filelock import BaseFileLock, FileLock, SoftFileLease, Timeout

from ckpt_tool.core import layout
from ckpt_tool.core.file_checks import DiskEntry, Problem, hash_problems, structure_problems
from ckpt_tool.core.index import EventLog, IndexEvent, format_event, known_invalid, parse_index
from ckpt_tool.core.listing import Listing, build_rows, latest_problem
from ckpt_tool.core.manifest import Manifest
from ckpt_tool.core.ownership import Owner, decide, same_claim
from ckpt_tool.core.retention import RetentionPolicy, kept_candidates, steps_to_delete
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.checksums import hash_files
from ckpt_tool.store.durable import append_line, atomic_write, current_umask, fsync_dir

log = logging.getLogger("ckpt_tool")
MAX_MANIFEST_BYTES = 64 << 20
LOCK_TIMEOUT_S = 120.0
RECORD_LOCK_TIMEOUT_S = 10.0  # recording a check result is best effort: do not wait long
# Where flock does not work, the lock is a lease its holder renews every third of this: a lock
# left by a process that died (on any host) is taken over once it has not changed for this long.
# Every writer of a directory must agree on it, so it is a constant, not a setting.
SOFT_LOCK_LEASE_S = 30.0


@dataclass(frozen=True)
class ValidationResult:
    step: int
    problems: tuple[Problem, ...]  # damage: missing, truncated, altered or extra files
    manifest: Manifest | None
    unreadable: tuple[str, ...] = ()  # files this user may not read: not checked, and not damage

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unreadable


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
            except NotADirectoryError:
                raise CkptError(
                    f"{self.root} is a file, not a checkpoint directory",
                    "pass the directory given to the training run (the one that holds LATEST and step_NNNNNNNN/)",
                    ExitCode.USAGE,
                ) from None
            except FileNotFoundError:
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

    @property
    def uses_soft_lock(self) -> bool:
        """Whether this directory's lock is the soft lease (flock does not work here)."""
        return isinstance(self._lock_file(0), SoftFileLease)

    def _lock_file(self, timeout: float = LOCK_TIMEOUT_S) -> BaseFileLock:
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

    @contextmanager
    def changing(self, timeout: float = LOCK_TIMEOUT_S, check_owner: bool = True) -> Iterator[None]:
        """The one way any module changes this directory (pointer, index, manifests, moves,
        deletes): under its lock, and, once this process claimed the directory, refused when
        another job has taken it over since. A lock held longer than ``timeout`` is a
        ``CkptError`` (exit 4) naming it."""
        lock = self._lock_file(timeout)
        try:
            lock.acquire()
        except Timeout:
            raise CkptError(
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
        try:
            if check_owner:
                self._check_still_owner()
            yield
        finally:
            lock.release()

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
        return list(self.event_log().events)

    def event_log(self) -> EventLog:
        """The index with the numbers of the lines that are not events (torn by a crash, garbage)."""
        try:
            with open(self.root / layout.INDEX_NAME, encoding="utf-8", errors="replace") as f:
                return parse_index(f)
        except FileNotFoundError:
            return EventLog(())

    # ----------------------------------------------------------------- reading checkpoints
    def read_manifest(self, step: int) -> Manifest:
        path = self.step_path(step) / layout.MANIFEST_NAME
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            if not self.step_path(step).is_dir():
                raise self.no_such_step(step) from None
            raise CkptError(
                f"{path} is missing: step {step} was never committed or is damaged",
                "run `ckpt validate` and `ckpt rollback` to move to a complete checkpoint",
                ExitCode.FAILED,
            ) from None
        except PermissionError:
            raise self.permission_denied(path) from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise CkptError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes", "the manifest is damaged or hostile: quarantine it with `ckpt rollback`")
        manifest = Manifest.from_json(raw, where=str(path))
        if manifest.step != step:
            raise CkptError(
                f"{path} describes step {manifest.step}, not {step}: the manifest was copied from another checkpoint",
                "run `ckpt rollback` to move to a consistent checkpoint",
            )
        return manifest

    def no_such_step(self, step: int) -> CkptError:
        """A step that has no directory here (never saved, deleted by retention, or quarantined)."""
        steps = [e.step for e in self._scan() if e.kind is layout.EntryKind.STEP]
        shown = ", ".join(map(str, steps[-10:])) if steps else "none"
        quarantined = self.quarantine_root / layout.step_dir_name(step)
        where = f"; a copy may be in {self.quarantine_root}" if self.quarantine_root.is_dir() and any(n.startswith(quarantined.name) for n in os.listdir(self.quarantine_root)) else ""
        return CkptError(f"step {step} does not exist in {self.root}{where}", f"steps here: {shown} (see `ckpt list`)", ExitCode.NOT_FOUND)

    def permission_denied(self, path: Path) -> CkptError:
        return CkptError(
            f"permission denied reading {path}: it was not checked (this is not damage)",
            "run as the user who owns the checkpoint, or ask them to grant read access",
            ExitCode.USAGE,
        )

    def list_entries(self, step: int) -> dict[str, DiskEntry]:
        entries = {}
        try:
            with os.scandir(self.step_path(step)) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    entries[e.name] = DiskEntry(st.st_size, e.is_file(follow_symlinks=False))
        except PermissionError:
            raise self.permission_denied(self.step_path(step)) from None
        return entries

    def check_files(
        self,
        step: int,
        ranks: set[int] | None = None,
        threads: int | None = None,
        on_bytes: Callable[[int], None] | None = None,
        hashes: bool = True,
    ) -> ValidationResult:
        """Structure and content hashes of one checkpoint; ``ranks`` limits hashing to those ranks'
        files; ``hashes=False`` checks structure only (a loader that hashes as it reads).

        Damage is returned as problems. What is not damage is raised: a step that does not exist
        (exit 3), a manifest of a newer format (exit 4), a directory this user may not read
        (exit 2). Files this user may not read are returned apart (``unreadable``)."""
        try:
            manifest = self.read_manifest(step)
        except CkptError as exc:
            if exc.exit_code != ExitCode.FAILED:
                raise
            return ValidationResult(step, (Problem(layout.MANIFEST_NAME, "unreadable manifest", "valid manifest", exc.message),), None)
        problems = structure_problems(manifest.files, self.list_entries(step))
        broken = {p.file for p in problems}
        to_hash = [f for f in manifest.files if hashes and f.path not in broken and (ranks is None or f.rank in ranks)]
        unreadable: list[str] = []

        def on_error(name: str, exc: OSError) -> None:
            if isinstance(exc, PermissionError):
                unreadable.append(name)
            else:
                problems.append(Problem(name, "read error", "readable", exc.strerror or str(exc)))

        digests = hash_files(self.step_path(step), [f.path for f in to_hash], manifest.run_id, step, threads, on_bytes, on_error)
        problems += hash_problems(manifest.files, {d.name: d.hash for d in digests})
        return ValidationResult(step, tuple(problems), manifest, tuple(sorted(unreadable)))

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

    def listing(self) -> Listing:
        """``ckpt list``: every step directory found, with its status, and the state of LATEST.
        One directory listing plus the index; manifests only for steps the index does not
        describe (an index lost or truncated)."""
        entries = list(self._scan())
        step_dirs = {e.step: (self.root / e.name / layout.MANIFEST_NAME).is_file() for e in entries if e.kind is layout.EntryKind.STEP}
        log = self.event_log()
        known = {e.step for e in log.events if e.event == "commit"}
        summaries = {}
        for step in {s for s, committed in step_dirs.items() if committed} - known:
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
        try:
            latest, pointer_error = self.read_latest(), None
        except CkptError as exc:
            latest, pointer_error = None, exc.message
        rows = build_rows(
            step_dirs,
            [e.step for e in entries if e.kind is layout.EntryKind.PARTIAL],
            [e.step for e in entries if e.kind is layout.EntryKind.DELETING],
            quarantined,
            log.events,
            latest,
            summaries,
        )
        note = log.skipped_note(layout.INDEX_NAME)
        return Listing(tuple(rows), latest, latest_problem(latest, pointer_error, step_dirs, any(step_dirs.values())), (note,) if note else ())

    def kind(self, names: list[str] | None = None) -> layout.DirectoryKind:
        """What this directory is: ours, empty, one step directory, plain DCP, something else."""
        return layout.classify_directory(self.root.name, os.listdir(self.root) if names is None else names)

    def require_checkpoint_directory(self) -> None:
        """Refuse, saying what was found, a directory that is not a ckpt-tool checkpoint
        directory: an empty one, a single step directory, a plain DCP checkpoint, anything else.
        Commands that only read then never create files in a directory they do not own."""
        names = sorted(os.listdir(self.root))
        kind = self.kind(names)
        expects = "ckpt expects the directory given to CheckpointManager (it holds step_NNNNNNNN/ directories, LATEST and index.jsonl)"
        if kind is layout.DirectoryKind.CHECKPOINTS:
            return
        if kind is layout.DirectoryKind.EMPTY:
            raise CkptError(f"{self.root} is empty: no checkpoint was written there", f"check the path; a training run writes its first checkpoint there at its first save. {expects}", ExitCode.NOT_FOUND)
        if kind is layout.DirectoryKind.ONE_CHECKPOINT:
            raise CkptError(f"{self.root} is a single checkpoint, not a checkpoint directory", f"pass the directory that holds it: {self.root.parent}", ExitCode.USAGE)
        if kind is layout.DirectoryKind.PLAIN_DCP:
            raise CkptError(
                f"{self.root} is a plain DCP checkpoint (torch.distributed.checkpoint), not a ckpt-tool checkpoint directory",
                f"torch's dcp.load reads it as it is; {expects}",
                ExitCode.USAGE,
            )
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise CkptError(f"{self.root} is not a checkpoint directory: it holds {shown}", f"check the path; {expects}", ExitCode.USAGE)

    def record_check(self, step: int, kind: str, ok: bool, problems: list[str]) -> str | None:
        """Record a validation or verification result in the index (``validated`` / ``verified``).

        Best effort: a check of a directory this user may only read (a teammate's run, a
        snapshot) still counts. Returns why the result could not be recorded, or None."""
        try:
            with self.changing(RECORD_LOCK_TIMEOUT_S, check_owner=False):
                self.append_event(kind, step=step, ok=ok, problems=problems[:20])
        except CkptError as exc:
            return f"the result was not recorded in {self.root / layout.INDEX_NAME}: {exc.message}"
        except OSError as exc:
            return f"the result was not recorded in {self.root / layout.INDEX_NAME} ({exc.strerror or exc}); the check itself is complete"
        return None

    def _scan(self) -> Iterator[layout.DirEntry]:
        with os.scandir(self.root) as it:
            for e in it:
                parsed = layout.parse_entry(e.name)
                if parsed is not None and e.is_dir(follow_symlinks=False):
                    yield parsed

    # ----------------------------------------------------------------- ownership
    def claim(self, me: Owner, stale_after_s: float, take_over: bool) -> str:
        """Become the directory's writer, or raise naming the job that is (see core.ownership)."""
        with self.changing(check_owner=False):
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
            atomic_write(self.root / layout.OWNER_NAME, json.dumps(me.to_json()).encode())
            if current is None or current.pid != me.pid or current.host != me.host:
                self.append_event("owner", job_id=me.job_id, host=me.host, pid=me.pid, reason=decision.reason)
            self._claimed_as = me
            return decision.reason

    def _read_owner(self) -> Owner | None:
        """The recorded owner; None when there is none or the record is damaged."""
        try:
            return Owner.from_json(json.loads((self.root / layout.OWNER_NAME).read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def refresh_owner(self, me: Owner) -> None:
        """Say the owner is alive (``last_seen``); raises when another job took the directory over."""
        with self.changing():
            atomic_write(self.root / layout.OWNER_NAME, json.dumps(me.to_json()).encode())

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
        with self.changing():
            if target.exists():
                # A directory of the same step that LATEST never named: left by a crash between
                # rename and pointer move, or a run that went further before a rollback.
                self._move_to_quarantine(step, "superseded by a new save of the same step")
            os.rename(partial, target)
            fsync_dir(self.root)
            self._write_latest(step)
            self.append_event("commit", **commit_summary(manifest))
        return target

    def rewrite_manifest(self, step: int, manifest: Manifest, event: str, **data: object) -> None:
        """Replace a committed step's manifest (atomic) and record why, e.g. a reshard plan."""
        with self.changing():
            atomic_write(self.step_path(step) / layout.MANIFEST_NAME, manifest.to_json().encode())
            self.append_event(event, step=step, **data)

    def _move_to_quarantine(self, step: int, reason: str) -> Path:
        self.quarantine_root.mkdir(exist_ok=True)
        dest = self.quarantine_root / f"{layout.step_dir_name(step)}.{time.time_ns()}"
        os.rename(self.step_path(step), dest)
        fsync_dir(self.root)
        self.append_event("quarantine", step=step, reason=reason, moved_to=str(dest.relative_to(self.root)))
        return dest

    def quarantine(self, step: int, reason: str) -> Path:
        with self.changing():
            return self._move_to_quarantine(step, reason)

    def set_latest(self, step: int, reason: str, event: str = "rollback") -> None:
        with self.changing():
            if not (self.step_path(step) / layout.MANIFEST_NAME).is_file():
                raise CkptError(f"step {step} has no committed checkpoint in {self.root}", "pick a step shown by `ckpt list`", ExitCode.NOT_FOUND)
            previous = self.latest_or_none()
            self._write_latest(step)
            self.append_event(event, step=step, previous=previous, reason=reason)

    def latest_or_none(self) -> int | None:
        """LATEST's step, or None when it is missing or damaged (recovery paths only)."""
        try:
            return self.read_latest()
        except CkptError:
            return None

    # ----------------------------------------------------------------- retention
    def _retention_plan(self, policy: RetentionPolicy, failed: set[int]) -> tuple[list[int], list[int]]:
        """(victims, kept steps that may vouch for the directory, newest first)."""
        latest = self.read_latest()  # a damaged LATEST stops retention: rollback first
        if latest is None:
            return [], []
        committed = self.committed_on_disk()
        if not steps_to_delete(committed, latest, policy):
            return [], []  # the common case after a commit: no index read
        invalid = known_invalid(self.events()) | failed
        victims = steps_to_delete(committed, latest, policy, invalid)
        return victims, kept_candidates(committed, victims, invalid)

    def apply_retention(
        self,
        policy: RetentionPolicy,
        dry_run: bool = False,
        known_good: int | None = None,
        confirm: Callable[[int], bool] | None = None,
    ) -> list[int]:
        """Delete what the policy allows, and only while a kept checkpoint is known to pass
        validation: ``known_good`` (the step just committed, hashed as it was written), or the
        newest kept one that ``confirm(step)`` validates now. A kept step that fails no longer
        counts (the caller records it invalid) and the plan is made again, so older valid steps
        are kept in its place. Without either, nothing is deleted. Each delete is renamed aside
        first, so a crash never leaves a half-deleted ``step_N``. Returns the deleted (or, with
        ``dry_run``, the deletable) steps."""
        failed: set[int] = set()
        confirmed = known_good
        while True:
            victims, candidates = self._retention_plan(policy, failed)
            if not victims or confirmed in candidates:
                break
            if confirm is None:
                raise CkptError(
                    f"no checkpoint that retention would keep in {self.root} is known to pass validation: nothing deleted",
                    "validate first (`ckpt validate --all`), then prune",
                    ExitCode.FAILED,
                )
            step = candidates[0]  # newest first; each failure changes what is kept
            if confirm(step):
                confirmed = step
            else:
                failed.add(step)
        if not victims or dry_run:
            return victims
        with self.changing():
            victims, candidates = self._retention_plan(policy, failed)
            if confirmed not in candidates:
                raise CkptError(f"{self.root} changed while pruning (a new commit or rollback): nothing deleted", "run the prune again", ExitCode.CONFLICT)
            for step in victims:
                os.rename(self.step_path(step), self.root / layout.deleting_dir_name(step))
                self.append_event("delete", step=step, reason=f"retention: {policy.describe()}; step {confirmed} passed validation")
            fsync_dir(self.root)
        for step in victims:
            shutil.rmtree(self.root / layout.deleting_dir_name(step), ignore_errors=True)
        return victims

    # ----------------------------------------------------------------- after a crash
    def clean_up_after_crash(self, roll_forward: Callable[[int], bool] | None = None) -> list[str]:
        """Remove staging and half-deleted directories; settle the pointer.

        - A ``step_N`` newer than a sound LATEST (a crash between rename and pointer move) is
          rolled forward when ``roll_forward(step)`` says it is valid, else quarantined.
        - A LATEST that is missing or unreadable while committed steps exist is repaired once:
          it is pointed at the newest step ``roll_forward`` accepts (newer ones that fail are
          quarantined), with the cause recorded.
        Returns a line per action.
        """
        actions = []
        with self.changing():
            try:
                latest, pointer_error = self.read_latest(), None
            except CkptError as exc:
                latest, pointer_error = None, exc.message
            entries = sorted(self._scan(), key=lambda e: e.step)
            for entry in entries:
                if entry.kind in (layout.EntryKind.PARTIAL, layout.EntryKind.DELETING):
                    shutil.rmtree(self.root / entry.name, ignore_errors=True)
                    self.append_event("cleanup", name=entry.name, reason=f"{entry.kind.value} directory left by a crash")
                    actions.append(f"removed {entry.name} (left by a crash)")
            committed = [e.step for e in entries if e.kind is layout.EntryKind.STEP and (self.root / e.name / layout.MANIFEST_NAME).is_file()]
            if latest is None and committed and roll_forward is not None:
                cause = pointer_error or "LATEST was missing"
                for step in reversed(committed):
                    if roll_forward(step):
                        self._write_latest(step)
                        self.append_event("repair_latest", step=step, reason=cause)
                        actions.append(f"{cause}: LATEST now names {layout.step_dir_name(step)}, the newest valid checkpoint")
                        latest = step
                        break
                    self._move_to_quarantine(step, f"not valid ({cause})")
                    actions.append(f"quarantined {layout.step_dir_name(step)} (not valid; {cause})")
            elif latest is not None:
                for step in (s for s in committed if s > latest):
                    if roll_forward is not None and roll_forward(step):
                        self._write_latest(step)
                        self.append_event("roll_forward", step=step, previous=latest)
                        actions.append(f"LATEST moved forward to {layout.step_dir_name(step)} (committed, pointer not yet moved at the crash)")
                        latest = step
                    else:
                        self._move_to_quarantine(step, "newer than LATEST and not valid")
                        actions.append(f"quarantined {layout.step_dir_name(step)} (newer than LATEST, not valid)")
        return actions
