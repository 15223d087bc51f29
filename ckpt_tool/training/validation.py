"""Validation of a checkpoint: structure and hashes (the store), the mesh (one state file per
rank of it, the sizes fit the limits it records) and DCP metadata readable.

Used by ``ckpt validate``, ``ckpt rollback`` and the manager's resume, so all three judge a
checkpoint the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from ckpt_tool.core import layout
from ckpt_tool.core.file_checks import Problem, mesh_checks
from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore, ValidationResult
from ckpt_tool.timing import span
from ckpt_tool.training.safe_dcp import load_metadata_safely


def validate_checkpoint(
    store: CheckpointStore,
    step: int,
    ranks: set[int] | None = None,
    threads: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    hashes: bool = True,
    dcp_metadata: bool = True,
) -> ValidationResult:
    """Judge ``step``: the store's files (sizes, and hashes with ``hashes``; only ``ranks``' files when given),
    then, when rank 0's files are among them, the mesh checks and (with ``dcp_metadata``) every file the DCP
    metadata references listed in the manifest. Problems are returned, never raised; files this user cannot
    read go in ``unreadable``."""
    result = store.check_files(step, ranks, threads, on_bytes, hashes)
    if result.manifest is None or (ranks is not None and 0 not in ranks):
        return result
    result = ValidationResult(step, result.problems + tuple(mesh_checks(result.manifest)), result.manifest, result.unreadable)
    if any(p.file == layout.DCP_METADATA_NAME for p in result.problems) or layout.DCP_METADATA_NAME in result.unreadable:
        return result  # already named: missing, wrong size, wrong hash or not readable by this user
    if not dcp_metadata:
        return result
    listed = {f.path for f in result.manifest.files}
    extra: list[Problem] = []
    try:
        with open(store.step_path(step) / layout.DCP_METADATA_NAME, "rb") as f:
            with span("validate.dcp_metadata"):
                metadata = load_metadata_safely(f)
        referenced = {info.relative_path for info in (metadata.storage_data or {}).values()}
        extra = [
            Problem(name, "referenced by the DCP metadata but not in the manifest", "listed", "absent")
            for name in sorted(referenced - listed)
        ]
    except PermissionError:
        return ValidationResult(step, result.problems, result.manifest, tuple(sorted({*result.unreadable, layout.DCP_METADATA_NAME})))
    except (CkptError, OSError) as exc:
        extra = [Problem(layout.DCP_METADATA_NAME, "DCP metadata unreadable", "DCP Metadata", getattr(exc, "message", str(exc)))]
    return ValidationResult(step, result.problems + tuple(extra), result.manifest, result.unreadable)
