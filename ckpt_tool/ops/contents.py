"""``ckpt inspect``, ``ckpt du`` and ``ckpt quarantine``: what a checkpoint holds, where a
directory's bytes are, and the way back out of quarantine (restore) or out of the disk (purge,
only on request). Reads the DCP metadata without running its pickle."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ckpt_tool.core import layout
from ckpt_tool.core.contents_rules import Quarantined, bucket, parse_quarantined, placement
from ckpt_tool.errors import CkptError, ConflictError, DamageError, ExitCode
from ckpt_tool.store.durable import fsync_dir
from ckpt_tool.store.store import CheckpointStore, ValidationResult
from ckpt_tool.training.safe_dcp import load_metadata_safely


def inspect_step(store: CheckpointStore, step: int) -> dict[str, Any]:
    """The step's entries (key, shape, dtype, bytes, placement) and its manifest's run facts."""
    manifest = store.read_manifest(step)
    path = store.step_path(step) / layout.DCP_METADATA_NAME
    try:
        with open(path, "rb") as f:
            metadata = load_metadata_safely(f)
    except FileNotFoundError:
        raise DamageError(f"{path} is missing", "run `ckpt validate` and `ckpt rollback`", ExitCode.FAILED) from None
    entries = []
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            shape = [int(d) for d in md.size]
            dtype = md.properties.dtype
            nbytes = dtype.itemsize
            for d in shape:
                nbytes *= d
            chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
            entries.append(
                {
                    "key": key,
                    "kind": "tensor",
                    "shape": shape,
                    "dtype": str(dtype).removeprefix("torch."),
                    "bytes": nbytes,
                    "placement": placement(shape, chunks),
                }
            )
        else:
            entries.append({"key": key, "kind": "object", "shape": None, "dtype": None, "bytes": None, "placement": "whole"})
    facts = {
        "run_id": manifest.run_id,
        "step": manifest.step,
        "created_at": manifest.created_at,
        "world_size": manifest.world_size,
        "mesh": manifest.layout.to_json(),
        "mesh_text": manifest.layout.describe(),
        "batch": None if manifest.batch is None else dataclasses.asdict(manifest.batch),
        "env": dict(manifest.env),
        "probe": None if manifest.probe is None else dataclasses.asdict(manifest.probe),
        "entry_point": manifest.entry_point,
        "files": len(manifest.files),
        "file_bytes": manifest.total_bytes,
        "format_version": manifest.format_version,
    }
    tensors = [e for e in entries if e["kind"] == "tensor"]
    return {"step": step, "manifest": facts, "entries": entries, "tensor_bytes": sum(e["bytes"] for e in tensors), "tensors": len(tensors)}


def tree_bytes(path: Path) -> int:
    """Apparent size of a file, or of every file below a directory (links not followed)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except FileNotFoundError:
                continue  # removed while we looked (a retention delete)
    return total


def disk_usage(store: CheckpointStore) -> list[dict[str, Any]]:
    """Every top-level name of the directory (quarantine item by item), its kind and bytes."""
    rows = []
    for entry in sorted(os.scandir(store.root), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.name == layout.QUARANTINE_NAME and entry.is_dir(follow_symlinks=False):
            for q in sorted(path.iterdir()):
                rows.append({"name": f"{layout.QUARANTINE_NAME}/{q.name}", "kind": "quarantine", "bytes": tree_bytes(q)})
            continue
        rows.append({"name": entry.name, "kind": bucket(entry.name), "bytes": tree_bytes(path)})
    return rows


@dataclass(frozen=True)
class QuarantineRow:
    """One quarantined checkpoint in ``ckpt quarantine list``: what it is, its size in bytes and why it was
    moved aside (the index's words; empty when unknown)."""

    item: Quarantined
    bytes: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        """``--json``'s form: name, step, when it was moved (epoch seconds), bytes and reason."""
        return {
            "name": self.item.name,
            "step": self.item.step,
            "moved_at": self.item.moved_ns / 1e9,
            "bytes": self.bytes,
            "reason": self.reason,
        }


def quarantined(store: CheckpointStore) -> list[QuarantineRow]:
    """What quarantine/ holds, oldest first, with the reason the index recorded for each."""
    if not store.quarantine_root.is_dir():
        return []
    reasons = {str(e.data.get("moved_to")): str(e.data.get("reason", "")) for e in store.events() if e.event == "quarantine"}
    rows = []
    for path in store.quarantine_root.iterdir():
        item = parse_quarantined(path.name)
        if item is not None and path.is_dir():
            rows.append(QuarantineRow(item, tree_bytes(path), reasons.get(f"{layout.QUARANTINE_NAME}/{path.name}", "")))
    return sorted(rows, key=lambda r: r.item.moved_ns)


def pick(rows: list[QuarantineRow], which: str) -> QuarantineRow:
    """A quarantined checkpoint by its name, or by step when only one of that step is there."""
    named = [r for r in rows if r.item.name == which]
    if not named and which.isdigit():
        named = [r for r in rows if r.item.step == int(which)]
    if len(named) == 1:
        return named[0]
    listed = ", ".join(r.item.name for r in rows) or "none"
    if named:
        raise CkptError(f"step {which} is in quarantine {len(named)} times", f"give the name of one: {listed}", ExitCode.USAGE)
    raise CkptError(f"no quarantined checkpoint {which!r}", f"`ckpt quarantine list` shows them: {listed}", ExitCode.NOT_FOUND)


def restore(store: CheckpointStore, which: str, dry_run: bool) -> tuple[QuarantineRow, ValidationResult | None]:
    """Move a quarantined checkpoint back to its step directory (LATEST is not moved) and
    validate it there; refused when that step directory exists."""
    with store.changing():
        row = pick(quarantined(store), which)
        dest = store.step_path(row.item.step)
        if dest.exists():
            raise ConflictError(
                f"{dest.name} exists in {store.root}: restoring would replace it",
                "move or prune that step first (`ckpt list` shows its state)",
                ExitCode.CONFLICT,
            )
        if dry_run:
            return row, None
        os.rename(store.quarantine_root / row.item.name, dest)
        fsync_dir(store.root)
        store.append_event("restored", step=row.item.step, moved_from=f"{layout.QUARANTINE_NAME}/{row.item.name}")
    result = store.check_files(row.item.step)
    store.record_check(row.item.step, "validated", result.ok, [str(p) for p in result.problems])
    return row, result


def purge(store: CheckpointStore, older_than_days: float | None, dry_run: bool, now: float | None = None) -> list[QuarantineRow]:
    """Delete quarantined checkpoints (moved there more than ``older_than_days`` ago, or all)."""
    cutoff = (now or time.time()) - (older_than_days or 0) * 86400
    with store.changing():
        gone = [r for r in quarantined(store) if older_than_days is None or r.item.moved_ns / 1e9 < cutoff]
        if not dry_run and gone:
            for r in gone:
                shutil.rmtree(store.quarantine_root / r.item.name)
            fsync_dir(store.quarantine_root)
            store.append_event("quarantine_purged", names=[r.item.name for r in gone], bytes=sum(r.bytes for r in gone))
    return gone
