"""The listing of a checkpoint directory (``ckpt list``): every step directory with its status,
and the state of LATEST. Reads only; the rows are built by ``core.listing`` (pure)."""

from __future__ import annotations

import os

from ckpt_tool.core import layout
from ckpt_tool.core.listing import Listing, build_rows, commit_summary, latest_problem, local_rows
from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore


def listing(store: CheckpointStore) -> Listing:
    """Every step directory of ``store`` with its status, and the state of LATEST. One directory
    listing plus the index; manifests only for steps the index does not describe (an index lost
    or truncated)."""
    entries = list(store.entries())
    root = os.fspath(store.root)  # strings, not Paths: 10,000 steps cost 0.1 s of pathlib joins
    step_dirs = {e.step: os.path.isfile(f"{root}/{e.name}/{layout.MANIFEST_NAME}") for e in entries if e.kind is layout.EntryKind.STEP}
    log = store.event_log()
    known = {e.step for e in log.events if e.event == "commit"}
    summaries = {}
    for step in {s for s, committed in step_dirs.items() if committed} - known:
        try:
            summaries[step] = commit_summary(store.read_manifest(step))
        except CkptError:
            pass
    quarantined = []
    if store.quarantine_root.is_dir():
        for name in sorted(os.listdir(store.quarantine_root)):
            step = layout.parse_step_dir_name(name.split(".")[0])
            if step is not None:
                quarantined.append((step, name))
    latest, pointer_error = store.read_latest_or_problem()
    rows = build_rows(
        step_dirs,
        [e.step for e in entries if e.kind is layout.EntryKind.PARTIAL],
        [e.step for e in entries if e.kind is layout.EntryKind.DELETING],
        quarantined,
        log.events,
        latest,
        summaries,
    )
    newest_committed = max((s for s, c in step_dirs.items() if c), default=None)
    rows = sorted(rows + local_rows(log.events, newest_committed), key=lambda r: (r.step, r.status))
    note = log.skipped_note(layout.INDEX_NAME)
    return Listing(tuple(rows), latest, latest_problem(latest, pointer_error, step_dirs, any(step_dirs.values())), (note,) if note else ())
