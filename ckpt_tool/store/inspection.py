"""Looking at a checkpoint directory without changing it: every step directory with its status
and the state of LATEST (``ckpt list``), and whether it is a checkpoint directory at all. Part of
``CheckpointStore``; the decisions are pure (``core.listing``, ``core.layout``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ckpt_tool.core import layout
from ckpt_tool.core.listing import Listing, build_rows, commit_summary, latest_problem, local_rows
from ckpt_tool.errors import CkptError, DamageError, ExitCode

if TYPE_CHECKING:
    from ckpt_tool.store.store import CheckpointStore


class InspectionMixin:
    def listing(self: CheckpointStore) -> Listing:
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
        rows = sorted(
            rows + local_rows(log.events, max((s for s, c in step_dirs.items() if c), default=None)), key=lambda r: (r.step, r.status)
        )
        note = log.skipped_note(layout.INDEX_NAME)
        return Listing(
            tuple(rows), latest, latest_problem(latest, pointer_error, step_dirs, any(step_dirs.values())), (note,) if note else ()
        )

    def require_latest(self: CheckpointStore) -> int:
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

    def kind(self: CheckpointStore, names: list[str] | None = None) -> layout.DirectoryKind:
        """What this directory is: ours, empty, one step directory, plain DCP, something else."""
        return layout.classify_directory(self.root.name, os.listdir(self.root) if names is None else names)

    def require_checkpoint_directory(self: CheckpointStore) -> None:
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
