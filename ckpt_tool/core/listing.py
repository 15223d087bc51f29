"""What ``ckpt list`` shows: every step directory it finds, with its status. Pure.

Statuses: ``partial`` (a save in progress, or left by a crash) < ``committed`` (manifest present)
< ``validated`` (hashes checked) < ``verified`` (probe checks passed); ``invalid`` when the last
check failed; ``damaged`` for a step directory without a manifest (a commit writes it before the
directory gets its name, so its absence is damage); ``deleting`` for a retention delete cut
short; ``missing`` for the step LATEST names when its directory is gone; ``quarantined`` when moved
aside. Summaries come from the index's commit events, so listing reads no manifest for steps the
index describes (``summaries`` fills in the others).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tool.core import layout
from ckpt_tool.core.index import CheckState, IndexEvent, check_states
from ckpt_tool.core.manifest import Manifest


@dataclass(frozen=True)
class Row:
    """One step directory in ``ckpt list``: its step, status (see the module), whether LATEST names it, its
    path relative to the directory, and what the manifest and the index say (size in bytes, world size,
    mesh, global batch, probe loss, commit and last validation times in epoch seconds); None where
    unknown."""

    step: int
    status: str
    latest: bool
    path: str
    bytes: int | None = None
    world_size: int | None = None
    mesh: str | None = None  # "dp_shard=2,tp=2"
    global_batch: int | None = None
    probe_loss: float | None = None
    committed_at: float | None = None
    last_validated: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The row's fields as a JSON-ready dict (``ckpt list --json``)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Listing:
    """What ``ckpt list`` shows of one directory: its rows, oldest first, what LATEST names and any notes to
    tell the user."""

    rows: tuple[Row, ...]
    latest: int | None  # the step LATEST names (None: no LATEST, or unreadable)
    latest_problem: str | None  # why LATEST cannot be trusted: garbage, a missing or damaged step
    notes: tuple[str, ...] = ()  # skipped index lines and the like

    def to_json(self, root: str) -> dict[str, Any]:
        """``ckpt list --json``: the directory, LATEST and its problem, every checkpoint (with its path
        under ``root``, except fast-tier rows) and the notes."""
        return {
            "directory": root,
            "latest": self.latest,
            "latest_problem": self.latest_problem,
            "checkpoints": [r.to_json() | ({"path": f"{root}/{r.path}"} if r.status != "local" else {}) for r in self.rows],
            "notes": list(self.notes),
        }


def build_rows(
    step_dirs: Mapping[int, bool],
    partial: Iterable[int],
    deleting: Iterable[int],
    quarantined: Iterable[tuple[int, str]],
    events: Iterable[IndexEvent],
    latest: int | None,
    summaries: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[Row]:
    """``step_dirs``: every ``step_N`` directory -> whether it holds a manifest."""
    events = list(events)
    states = check_states(events)
    last_commit = {ev.step: ev.data for ev in events if ev.event == "commit" and ev.step is not None}
    rows = []
    for step, has_manifest in step_dirs.items():
        info = {**(summaries or {}).get(step, {}), **last_commit.get(step, {})}
        state = states.get(step, CheckState("committed"))
        rows.append(
            Row(
                step,
                state.status if has_manifest else "damaged",
                step == latest,
                layout.step_dir_name(step),
                info.get("bytes"),
                info.get("world_size"),
                info.get("mesh"),
                info.get("global_batch"),
                info.get("probe_loss"),
                info.get("created_at"),
                state.validated_at,
            )
        )
    if latest is not None and latest not in step_dirs:
        rows.append(Row(latest, "missing", True, layout.step_dir_name(latest)))
    rows += [Row(step, "partial", False, layout.partial_dir_name(step)) for step in partial]
    rows += [Row(step, "deleting", False, layout.deleting_dir_name(step)) for step in deleting]
    rows += [Row(step, "quarantined", False, f"{layout.QUARANTINE_NAME}/{name}") for step, name in quarantined]
    return sorted(rows, key=lambda r: (r.step, r.status))


def local_rows(events: Iterable[IndexEvent], shared_newest: int | None) -> list[Row]:
    """The fast tier's steps a resume could still take, as the save thread recorded them
    (``local_saved``: which node holds which ranks' files; ``local_cleared`` at the end of a run,
    ``rollback`` of the shared tier):
    newer than the newest shared checkpoint, the newest ``keep`` of them. Listed from the index,
    not checked: the files are on the nodes."""
    saved: dict[int, dict[str, Any]] = {}
    keep = 2
    for ev in events:
        if ev.event in ("local_cleared", "rollback"):  # a rollback makes the local steps saved before it unusable
            saved.clear()
        elif ev.event == "local_saved" and ev.step is not None:
            saved[ev.step] = ev.data
            keep = ev.data.get("keep", keep) if isinstance(ev.data.get("keep"), int) else keep
    steps = sorted((s for s in saved if shared_newest is None or s > shared_newest), reverse=True)[:keep]
    rows = []
    for step in sorted(steps):
        d = saved[step]
        holders = d.get("holders") if isinstance(d.get("holders"), dict) else {}
        where = "; ".join(
            f"{node}: ranks {','.join(map(str, ranks if isinstance(ranks, list) else []))}" for node, ranks in sorted(holders.items())
        )
        rows.append(
            Row(
                step,
                "local",
                False,
                f"node-local ({where})",
                d.get("bytes"),
                d.get("world_size"),
                d.get("mesh"),
                d.get("global_batch"),
                None,
                d.get("created_at"),
            )
        )
    return rows


def latest_problem(latest: int | None, pointer_error: str | None, step_dirs: Mapping[int, bool], any_checkpoint: bool) -> str | None:
    """Why LATEST cannot be trusted, in words; None when it names a committed step (or when the
    directory has no checkpoint at all, so a missing LATEST is expected)."""
    if pointer_error is not None:
        return pointer_error
    if latest is None:
        return "LATEST is missing although checkpoints exist" if any_checkpoint else None
    if latest not in step_dirs:
        return f"LATEST names step {latest}, whose directory is missing"
    if not step_dirs[latest]:
        return f"LATEST names step {latest}, which has no manifest (damaged)"
    return None


def commit_summary(manifest: Manifest) -> dict[str, object]:
    """What ``ckpt list`` shows of a checkpoint, kept in the index so listing reads no manifest."""
    return {
        "step": manifest.step,
        "bytes": manifest.total_bytes,
        "run_id": manifest.run_id,
        "world_size": manifest.world_size,
        "mesh": manifest.layout.compact(),
        "global_batch": manifest.batch.global_batch if manifest.batch is not None else None,
        "probe_loss": manifest.probe.loss if manifest.probe is not None else None,
        "created_at": manifest.created_at,
    }
