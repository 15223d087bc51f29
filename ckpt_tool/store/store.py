"""The checkpoint store: one checkpoint directory on a (shared) filesystem, and its only writer.

One concept: the directory's own files. The staging directory, the commit (manifest last, fsync,
atomic rename, LATEST, index), LATEST itself (read, required, moved), the index, manifests (read,
rewritten), quarantine, and what kind of directory this is. Every change goes through
``changing()``: under the directory's lock (``store.locks``) and refused once another job took it
over (the claim: ``store.claim``, composed in as ``store.owner``). Finding the newest committed
checkpoint reads LATEST (constant time).

What uses a store lives beside it, as functions taking one: the listing (``store.inventory``),
retention's deletes (``store.prune``), the recovery executor and the crash clean-up
(``store.recovery``). They change the directory only through the public surface here: under
``changing()``, the ``*_locked`` methods (``write_latest_locked``, ``quarantine_locked``,
``set_latest_locked``), ``append_event`` and ``entries()``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

from ckpt_tool.core import layout
from ckpt_tool.core.claim_rules import Owner
from ckpt_tool.core.file_checks import DiskEntry, Problem, hash_problems, structure_problems
from ckpt_tool.core.index import EventLog, IndexEvent, format_event, parse_index
from ckpt_tool.core.listing import commit_summary
from ckpt_tool.core.manifest import Manifest
from ckpt_tool.errors import CkptError, DamageError, ExitCode, PermissionDeniedError
from ckpt_tool.store.checksums import hash_files
from ckpt_tool.store.claim import OwnerRecord
from ckpt_tool.store.durable import append_line, atomic_write, fsync_dir
from ckpt_tool.store.locks import LOCK_TIMEOUT_S, DirectoryLock
from ckpt_tool.timing import span

log = logging.getLogger("ckpt_tool")
MAX_MANIFEST_BYTES = 64 << 20
RECORD_LOCK_TIMEOUT_S = 10.0  # recording a check result is best effort: do not wait long
STAT_THREADS = 16  # stats of a step directory's files in flight at once (list_entries)
PARALLEL_STATS_FROM = 64  # files; fewer are stat'ed one by one (a thread pool costs more than it saves)


@dataclass(frozen=True)
class ValidationResult:
    """One step's check (``check_files``): damage found, the manifest read, files not readable."""

    step: int
    problems: tuple[Problem, ...]  # damage: missing, truncated, altered or extra files
    manifest: Manifest | None
    unreadable: tuple[str, ...] = ()  # files this user may not read: not checked, and not damage

    @property
    def ok(self) -> bool:
        """Nothing damaged and every file read."""
        return not self.problems and not self.unreadable


class CheckpointStore:
    """One checkpoint directory. Reading needs no lock; every change goes through ``changing()``.

    Args:
        root: the directory.
        create: make it (and its parents) when missing; otherwise it must exist.

    Raises:
        CkptError: cannot be created (exit 2), does not exist (exit 3), is a file or may not be
            read by this user (exit 2). Methods raise it too, each saying why and what to do.
    """

    def __init__(self, root: Path | str, create: bool = False) -> None:
        self.root = Path(root)
        self._lock = DirectoryLock(self.root)
        self.owner = OwnerRecord(self.root)  # the owner file and the claim this process made (claim())
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
        """Where committed ``step`` lives: ``DIR/step_NNNNNNNN``."""
        return self.root / layout.step_dir_name(step)

    def partial_path(self, step: int) -> Path:
        """Where ``step`` is staged before its commit: ``DIR/.step_NNNNNNNN.partial``."""
        return self.root / layout.partial_dir_name(step)

    @property
    def quarantine_root(self) -> Path:
        """``DIR/quarantine``: where damaged or rolled-back steps are moved (never deleted)."""
        return self.root / layout.QUARANTINE_NAME

    @contextmanager
    def changing(self, timeout: float = LOCK_TIMEOUT_S, check_owner: bool = True) -> Iterator[None]:
        """The one way any module changes this directory (pointer, index, manifests, moves,
        deletes): under its lock (``store.locks``), and, once this process claimed the
        directory, refused when another job has taken it over since.

        Raises:
            CkptError: the lock is held longer than ``timeout`` (exit 4); the directory is
                read-only or not this user's to change (exit 2); another job took it over (exit 4).
        """
        lock = self._lock.acquire(timeout)
        try:
            if check_owner:
                self.owner.check_still_ours()
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
            raise DamageError(
                f"{path} is damaged: {exc}",
                f"run `ckpt rollback {self.root} --auto` to point it at the newest valid checkpoint",
                ExitCode.FAILED,
            ) from None

    def read_latest_or_problem(self) -> tuple[int | None, str | None]:
        """(LATEST's step, None), or (None, why LATEST cannot be read) when it is garbage."""
        try:
            return self.read_latest(), None
        except CkptError as exc:
            return None, exc.message

    def require_latest(self) -> int:
        """The step LATEST names when it is a committed checkpoint (one read on that path); else
        what is wrong with LATEST and the command that repairs it: no LATEST in a directory that
        holds committed checkpoints, a step whose directory is gone or has no manifest (exit 1),
        no checkpoint at all (exit 3)."""
        latest = self.read_latest()
        repair = f"run `ckpt rollback {self.root} --auto` to point it at the newest valid checkpoint (`ckpt list {self.root}` shows them)"
        if latest is None:
            committed = self.committed_on_disk()
            if not committed:
                raise CkptError(
                    f"{self.root} has no committed checkpoint yet", "a training run writes LATEST at its first save", ExitCode.NOT_FOUND
                )
            raise DamageError(
                f"LATEST is missing in {self.root}, which holds committed checkpoints (steps {', '.join(map(str, committed[-10:]))})",
                repair,
                ExitCode.FAILED,
            )
        if not self.step_path(latest).is_dir():
            raise DamageError(
                f"LATEST in {self.root} names step {latest}, which is not a committed checkpoint: its directory is missing",
                repair,
                ExitCode.FAILED,
            )
        if not (self.step_path(latest) / layout.MANIFEST_NAME).is_file():
            raise DamageError(
                f"LATEST in {self.root} names step {latest}, which is not a committed checkpoint: it has no manifest (damaged)",
                repair,
                ExitCode.FAILED,
            )
        return latest

    def write_latest_locked(self, step: int) -> None:
        """Point LATEST at ``step`` (atomic replace). The caller holds the lock (``changing()``),
        has decided the step (the commit, the recovery planner) and records the event."""
        atomic_write(self.root / layout.LATEST_NAME, layout.format_pointer(step).encode())

    def append_event(self, event: str, **data: object) -> None:
        """Append one event to the index (``index.jsonl``); the caller holds the lock."""
        append_line(self.root / layout.INDEX_NAME, format_event(event, time.time(), **data))

    def events(self) -> list[IndexEvent]:
        """The index's events, oldest first (torn or garbage lines skipped)."""
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
        """Committed ``step``'s manifest, parsed strictly. Raises ``DamageError`` when it is missing,
        oversized, torn or copied from another step; ``no_such_step`` when the step is not here."""
        with span("store.read_manifest"):
            path = self.step_path(step) / layout.MANIFEST_NAME
            try:
                with open(path, "rb") as f:
                    raw = f.read(MAX_MANIFEST_BYTES + 1)
            except FileNotFoundError:
                if not self.step_path(step).is_dir():
                    raise self.no_such_step(step) from None
                raise DamageError(
                    f"{path} is missing: step {step} was never committed or is damaged",
                    "run `ckpt validate` and `ckpt rollback` to move to a complete checkpoint",
                    ExitCode.FAILED,
                ) from None
            except PermissionError:
                raise self.permission_denied(path) from None
            if len(raw) > MAX_MANIFEST_BYTES:
                raise DamageError(
                    f"{path} is larger than {MAX_MANIFEST_BYTES} bytes",
                    "the manifest is damaged or hostile: quarantine it with `ckpt rollback`",
                )
            manifest = Manifest.from_json(raw, where=str(path))
            if manifest.step != step:
                raise DamageError(
                    f"{path} describes step {manifest.step}, not {step}: the manifest was copied from another checkpoint",
                    "run `ckpt rollback` to move to a consistent checkpoint",
                )
            return manifest

    def no_such_step(self, step: int) -> CkptError:
        """A step that has no directory here (never saved, deleted by retention, or quarantined)."""
        steps = sorted(e.step for e in self.entries() if e.kind is layout.EntryKind.STEP)
        shown = ", ".join(map(str, steps[-10:])) if steps else "none"
        quarantined = self.quarantine_root / layout.step_dir_name(step)
        where = (
            f"; a copy may be in {self.quarantine_root}"
            if self.quarantine_root.is_dir() and any(n.startswith(quarantined.name) for n in os.listdir(self.quarantine_root))
            else ""
        )
        return CkptError(f"step {step} does not exist in {self.root}{where}", f"steps here: {shown} (see `ckpt list`)", ExitCode.NOT_FOUND)

    def permission_denied(self, path: Path) -> PermissionDeniedError:
        """The error for a file of this directory this user may not read (not damage, exit 2)."""
        return PermissionDeniedError(
            f"permission denied reading {path}: it was not checked (this is not damage)",
            "run as the user who owns the checkpoint, or ask them to grant read access",
        )

    def list_entries(self, step: int) -> dict[str, DiskEntry]:
        """Size and kind of every entry of a step directory. One stat per file, many at once: on a
        shared filesystem each is a round trip to the metadata server (a 4096-rank checkpoint has
        ~20k files: ~10 s one after the other at 0.5 ms, see ``bench/recovery_time.py``)."""
        path = self.step_path(step)
        try:
            with os.scandir(path) as it:
                names = [e.name for e in it]
            if len(names) < PARALLEL_STATS_FROM:
                stats = [os.lstat(path / n) for n in names]
            else:
                with ThreadPoolExecutor(STAT_THREADS, thread_name_prefix="ckpt-stat") as pool:
                    stats = list(pool.map(lambda n: os.lstat(path / n), names))
        except PermissionError:
            raise self.permission_denied(path) from None
        return {n: DiskEntry(st.st_size, S_ISREG(st.st_mode)) for n, st in zip(names, stats, strict=True)}

    def check_files(
        self,
        step: int,
        ranks: set[int] | None = None,
        threads: int | None = None,
        on_bytes: Callable[[int], None] | None = None,
        hashes: bool = True,
        files: Collection[str] | None = None,
    ) -> ValidationResult:
        """Structure and content hashes of one checkpoint; ``ranks`` and ``files`` (names) limit
        hashing to those ranks' files or to those files; ``hashes=False`` checks structure only (a
        loader that hashes as it reads).

        Damage is returned as problems. What is not damage is raised: a step that does not exist
        (exit 3), a manifest of a newer format (exit 4), a directory this user may not read
        (exit 2). Files this user may not read are returned apart (``unreadable``)."""
        try:
            manifest = self.read_manifest(step)
        except CkptError as exc:
            if not isinstance(exc, DamageError):  # a missing step, a newer format, no permission
                raise
            return ValidationResult(step, (Problem(layout.MANIFEST_NAME, "unreadable manifest", "valid manifest", exc.message),), None)
        problems = structure_problems(manifest.files, self.list_entries(step))
        broken = {p.file for p in problems}
        to_hash = [
            f
            for f in manifest.files
            if hashes and f.path not in broken and (ranks is None or f.rank in ranks) and (files is None or f.path in files)
        ]
        unreadable: list[str] = []

        def on_error(name: str, exc: OSError) -> None:
            if isinstance(exc, PermissionError):
                unreadable.append(name)
            else:
                problems.append(Problem(name, "read error", "readable", exc.strerror or str(exc)))

        with span("store.hash_files"):
            digests = hash_files(self.step_path(step), [f.path for f in to_hash], manifest.run_id, step, threads, on_bytes, on_error)
        problems += hash_problems(manifest.files, {d.name: d.hash for d in digests})
        return ValidationResult(step, tuple(problems), manifest, tuple(sorted(unreadable)))

    def committed_on_disk(self) -> list[int]:
        """Step directories holding a manifest (a directory listing: not for the hot path)."""
        steps = []
        for entry in self.entries():
            if entry.kind is layout.EntryKind.STEP and (self.root / entry.name / layout.MANIFEST_NAME).is_file():
                steps.append(entry.step)
        return sorted(steps)

    def step_dirs(self) -> list[int]:
        """Every ``step_N`` directory, committed or not (a manifest may be missing or damaged)."""
        return sorted(e.step for e in self.entries() if e.kind is layout.EntryKind.STEP)

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

    def entries(self) -> Iterator[layout.DirEntry]:
        """The directory's step, staging and half-deleted directories, as named (one listing)."""
        with os.scandir(self.root) as it:
            for e in it:
                parsed = layout.parse_entry(e.name)
                if parsed is not None and e.is_dir(follow_symlinks=False):
                    yield parsed

    # ----------------------------------------------------------------- writing
    def begin_staging(self, step: int) -> Path:
        """The staging directory ``.step_N.partial`` every rank writes its files into (no lock:
        the ranks write in parallel; nothing there is a checkpoint until ``commit``)."""
        partial = self.partial_path(step)
        partial.mkdir(exist_ok=True)
        return partial

    def discard_staging(self, step: int) -> None:
        """Remove what a failed save staged; the previous checkpoint is untouched."""
        shutil.rmtree(self.partial_path(step), ignore_errors=True)

    def commit(self, step: int, manifest: Manifest, facts: Mapping[str, object] | None = None) -> Path:
        """Make the staged ``.step_N.partial`` the committed ``step_N`` and point LATEST at it.

        The manifest is written last into the staging directory (temp + fsync + rename), the
        directory is fsynced and renamed, the parent fsynced; then LATEST moves and the index
        records the commit, all under the lock. A crash at any instant leaves LATEST on a
        complete checkpoint. ``facts``: more fields of the index's ``commit`` event.
        """
        partial = self.partial_path(step)
        with span("store.commit"):
            atomic_write(partial / layout.MANIFEST_NAME, manifest.to_json().encode())
            target = self.step_path(step)
            with self.changing():
                if target.exists():
                    # A directory of the same step that LATEST never named: left by a crash between
                    # rename and pointer move, or a run that went further before a rollback.
                    self.quarantine_locked(step, "superseded by a new save of the same step")
                os.rename(partial, target)
                fsync_dir(self.root)
                self.write_latest_locked(step)
                self.append_event("commit", **commit_summary(manifest), **(facts or {}))
        return target

    def rewrite_manifest(self, step: int, manifest: Manifest, event: str, **data: object) -> None:
        """Replace a committed step's manifest (atomic) and record why, e.g. a reshard plan."""
        with self.changing():
            atomic_write(self.step_path(step) / layout.MANIFEST_NAME, manifest.to_json().encode())
            self.append_event(event, step=step, **data)

    def quarantine_locked(self, step: int, reason: str) -> Path:
        """``quarantine`` for a caller that holds the lock (the commit, the recovery executor):
        move ``step_N`` into quarantine/ (never delete it) and record ``reason``."""
        self.quarantine_root.mkdir(exist_ok=True)
        dest = self.quarantine_root / f"{layout.step_dir_name(step)}.{time.time_ns()}"
        os.rename(self.step_path(step), dest)
        fsync_dir(self.root)
        self.append_event("quarantine", step=step, reason=reason, moved_to=str(dest.relative_to(self.root)))
        return dest

    def quarantine(self, step: int, reason: str) -> Path:
        """Move committed ``step`` aside into quarantine/, recording ``reason``; returns where."""
        with self.changing():
            return self.quarantine_locked(step, reason)

    def set_latest(self, step: int, reason: str, event: str = "rollback") -> None:
        """Point LATEST at committed ``step`` and record ``event`` with the previous one."""
        with self.changing():
            self.set_latest_locked(step, reason, event)

    def set_latest_locked(self, step: int, reason: str, event: str = "rollback") -> None:
        """``set_latest`` for a caller that holds the directory's lock (the recovery executor)."""
        if not (self.step_path(step) / layout.MANIFEST_NAME).is_file():
            raise CkptError(
                f"step {step} has no committed checkpoint in {self.root}", "pick a step shown by `ckpt list`", ExitCode.NOT_FOUND
            )
        previous = self.latest_or_none()
        self.write_latest_locked(step)
        self.append_event(event, step=step, previous=previous, reason=reason)

    def latest_or_none(self) -> int | None:
        """LATEST's step, or None when it is missing or damaged (recovery paths only)."""
        try:
            return self.read_latest()
        except CkptError:
            return None

    # ----------------------------------------------------------------- what this directory is
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
            raise CkptError(
                f"{self.root} is empty: no checkpoint was written there",
                f"check the path; a training run writes its first checkpoint there at its first save. {expects}",
                ExitCode.NOT_FOUND,
            )
        if kind is layout.DirectoryKind.ONE_CHECKPOINT:
            raise CkptError(
                f"{self.root} is a single checkpoint, not a checkpoint directory",
                f"pass the directory that holds it: {self.root.parent}",
                ExitCode.USAGE,
            )
        if kind is layout.DirectoryKind.PLAIN_DCP:
            raise CkptError(
                f"{self.root} is a plain DCP checkpoint (torch.distributed.checkpoint), not a ckpt-tool checkpoint directory",
                f"to start a run from its weights: `ckpt adopt {self.root} NEW_DIR`; torch's dcp.load reads it as it is; {expects}",
                ExitCode.USAGE,
            )
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise CkptError(f"{self.root} is not a checkpoint directory: it holds {shown}", f"check the path; {expects}", ExitCode.USAGE)

    # ----------------------------------------------------------------- the claim (store.claim)
    def claim(self, me: Owner, stale_after_s: float, take_over: bool) -> str:
        """Become the directory's writer, or raise naming the job that is (see core.claim_rules).
        Returns why the claim was allowed."""
        with self.changing(check_owner=False):
            claimed = self.owner.take(me, stale_after_s, take_over)
            if claimed.changed_hands:
                self.append_event("owner", job_id=me.job_id, host=me.host, pid=me.pid, reason=claimed.reason)
            return claimed.reason

    def refresh_owner(self, me: Owner) -> None:
        """Say the owner is alive (``last_seen``); raises when another job took the directory over."""
        with self.changing():
            self.owner.write(me)


def newest_step(ckpt_dir: Path | None) -> int | None:
    """The newest committed step of ``ckpt_dir``, or None (no directory given, none yet, or
    LATEST unreadable): what a supervisor reports, never a reason to fail."""
    try:
        return None if ckpt_dir is None else CheckpointStore(ckpt_dir).latest_or_none()
    except CkptError:
        return None
