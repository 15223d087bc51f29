"""``ckpt recover``: the one decision taken at every start or requeue of a job, before training.

Newest committed checkpoint (LATEST) -> its structure checked (manifest, every file present with
its size, the DCP metadata's bytes by hash: no data read, the same cost at 8 ranks or 4096, no
torch import) -> if damaged, roll back (quarantine, never delete) to the newest valid one ->
compare its world size with the allocation and, if it changed, check and plan the reshard
(refused with the reason when the shapes or the global batch do not fit the new size). The
content hashes are the ranks': each checks its files as it loads them (each byte read once,
spread over the ranks), and damage found then quarantines the checkpoint and sends every rank
back to the previous one together (``training.resume``). ``full=True`` (``--full``) also hashes
every file here, as ``ckpt validate`` does. The decision goes to ``RUN_DIR/recover.json`` and the
run's event log, where ``ckpt status`` finds it. The ranks' resume takes it as its decision while
it is current (the same directory, LATEST still on its step, the facts it judged unchanged since, the
same world size: ``core.recovery.stale_because``), so the step is not chosen twice; a stale one is
not followed (the ranks plan themselves through the same planner).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ckpt_tool.core import layout
from ckpt_tool.core.file_checks import mesh_checks
from ckpt_tool.core.layout import DirectoryKind
from ckpt_tool.core.recovery import RECOVER_NAME
from ckpt_tool.ops.rollback import rollback
from ckpt_tool.store import recovery
from ckpt_tool.store.durable import atomic_write
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.supervise.run_dir import note, read_events

DECISION_NAME = RECOVER_NAME


@dataclass(frozen=True)
class Decision:
    """``ckpt recover``'s decision as written to ``RUN_DIR/recover.json``: a fresh start or the step to resume
    (and what was rolled back, quarantined, cleaned up), the saved and current world sizes with the reshard plan
    when they differ, and the seconds it took. ``store`` and ``facts`` let the ranks tell whether it is still current."""

    action: str  # "fresh" | "resume"
    step: int | None
    rolled_back_from: int | None
    quarantined: tuple[int, ...]
    saved_world_size: int | None
    world_size: int | None
    cleanup: tuple[str, ...]
    seconds: float
    reshard: dict[str, object] | None = None  # the plan (meshes and batch) when the world size changed
    nodes: int | None = None  # nodes of this allocation (the sbatch script says)
    nodes_before: int | None = None  # nodes of the previous start or round that recorded them
    hashes_checked: bool = False  # the content was hashed here (--full); otherwise the ranks hash it as they load
    store: str | None = None  # the checkpoint directory decided on (resolved), with...
    facts: str | None = None  # ...a fingerprint of what it judged: the ranks follow the decision while both hold

    def to_json(self) -> dict[str, object]:
        """Every field by name, as ``recover.json`` and the ``recover`` event hold it."""
        return asdict(self)


def _nodes_before(run_dir: Path | None) -> int | None:
    if run_dir is None:
        return None
    recorded = [e.get("nodes") for e in read_events(run_dir) if e.get("event") == "recover"]
    return next((n for n in reversed(recorded) if isinstance(n, int)), None)


def _identity(ckpt_dir: Path) -> dict[str, object]:
    """The store and the fingerprint of its facts after the decision: what the ranks check it against."""
    where, facts = recovery.identity(CheckpointStore(ckpt_dir))
    return {"store": where, "facts": facts}


def usable(store: CheckpointStore, step: int, full: bool = False) -> bool:
    """The start's check: the structure (manifest, files and sizes, one state file per rank of
    the mesh) and the DCP metadata's bytes by hash (kilobytes; torch is not imported to decide);
    ``full`` is ``ckpt validate``'s check: every hash, the metadata unpickled safely."""
    if full:
        from ckpt_tool.training.validation import validate_checkpoint

        return validate_checkpoint(store, step).ok
    result = store.check_files(step, files={layout.DCP_METADATA_NAME})
    return result.ok and result.manifest is not None and not mesh_checks(result.manifest)


def recover(
    ckpt_dir: Path, world_size: int | None = None, run_dir: Path | None = None, nodes: int | None = None, full: bool = False
) -> Decision:
    """Decide how this start of the job begins: clean up after a crash, roll back from a damaged LATEST, and plan
    the reshard when ``world_size`` differs from the checkpoint's; written to ``run_dir`` when given. Raises
    ``CkptError`` for a directory that is not a checkpoint store, nothing valid to roll back to, or a reshard
    that does not fit."""
    t0 = time.monotonic()
    if not ckpt_dir.exists() or CheckpointStore(ckpt_dir).kind() is DirectoryKind.EMPTY:
        decision = Decision("fresh", None, None, (), None, world_size, (), 0.0)
    else:
        store = CheckpointStore(ckpt_dir)
        store.require_checkpoint_directory()  # never writes into a directory that is not ours
        cleanup = tuple(recovery.clean_up_after_crash(store, roll_forward=lambda s: usable(store, s, full=True)))
        latest = store.latest_or_none()
        if latest is None and not store.committed_on_disk():
            decision = Decision("fresh", None, None, (), None, world_size, cleanup, 0.0)
        else:
            # the planner's Start: LATEST when it passes the start's check, else the rollback's target
            report = rollback(store, start_check=lambda s: usable(store, s, full))
            moved = report.target != latest or bool(report.quarantined)
            step, rolled_from, quarantined = report.target, latest if moved else None, report.quarantined
            saved = store.read_manifest(step).world_size
            reshard = None
            if world_size is not None and saved != world_size:
                # the allocation changed: check now that the checkpoint can be resumed at this size
                # (the mesh keeps its model-parallel sizes, shapes, global batch); the training's
                # resume applies the same plan (the shapes come from the DCP metadata: torch is imported here)
                from ckpt_tool.ops.reshard import check_reshard

                reshard = check_reshard(store, step, world_size).to_json()
            decision = Decision("resume", step, rolled_from, quarantined, saved, world_size, cleanup, 0.0, reshard)
    decision = Decision(
        **{
            **decision.to_json(),
            "seconds": round(time.monotonic() - t0, 3),
            "nodes": nodes,
            "nodes_before": _nodes_before(run_dir),
            "hashes_checked": full and decision.action == "resume",
            **(_identity(ckpt_dir) if decision.action == "resume" else {}),
        }
    )
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / DECISION_NAME, (json.dumps(decision.to_json(), indent=1) + "\n").encode())
        note(run_dir, "recover", **decision.to_json())
    return decision
