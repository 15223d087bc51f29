"""``ckpt reshard``: check that a checkpoint loads on a new mesh and plan the batch split.

The new mesh is the saved one with the world size (and ``--tp``) given: the model-parallel sizes
stay unless changed, the data-parallel size is what is left (``core.mesh.mesh_for``). The plan
(``core.reshard_plan``) checks the mesh fits the model and keeps the global batch; the shape check
reads tensor shapes from the DCP metadata (safely) and refuses a size that leaves ranks without
rows. ``--in-place`` records the plan in the manifest's lineage, where the checkpoint manager
finds it when the job resumes on that mesh (load-time resharding: DCP reshards as it loads).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ckpt_tool.core import layout
from ckpt_tool.core.mesh import Mesh, mesh_for
from ckpt_tool.core.reshard_plan import ReshardPlan, check_shapes, plan_resume
from ckpt_tool.errors import ExitCode, MisfitError
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import state_codec
from ckpt_tool.training.safe_dcp import load_metadata_safely


@dataclass(frozen=True)
class ReshardReport:
    """What ``check_reshard`` found: step ``step``, saved on ``old_world_size`` ranks, fits
    ``new_world_size`` with ``plan`` (the new mesh and batch split); ``data_position`` is rank 0's
    saved data position (None when its state file is absent)."""

    step: int
    old_world_size: int
    new_world_size: int
    plan: ReshardPlan
    data_position: dict[str, Any] | None

    @property
    def new_mesh(self) -> Mesh:
        """The mesh the checkpoint continues on (a checked report always has one)."""
        assert self.plan.new_mesh is not None
        return self.plan.new_mesh

    def to_json(self) -> dict[str, Any]:
        """``ckpt reshard --json``'s object: the step, both world sizes, the data position and the plan's fields."""
        return {
            "step": self.step,
            "old_world_size": self.old_world_size,
            "new_world_size": self.new_world_size,
            "data_position": self.data_position,
            **self.plan.to_json(),
        }


def tensor_shapes(store: CheckpointStore, step: int) -> dict[str, tuple[int, ...]]:
    """The global shape of every model tensor of ``step``, from its DCP metadata read with the
    safe unpickler (no tensor data read; a damaged ``.metadata`` raises ``DamageError``)."""
    with open(store.step_path(step) / layout.DCP_METADATA_NAME, "rb") as f:
        metadata = load_metadata_safely(f)
    return {k: tuple(m.size) for k, m in metadata.state_dict_metadata.items() if k.startswith("model.") and hasattr(m, "size")}


def check_reshard(
    store: CheckpointStore, step: int, world_size: int, micro_batch: int | None = None, sizes: Mapping[str, int] | None = None
) -> ReshardReport:
    """Can step ``step`` continue on ``world_size`` ranks (with the model-parallel ``sizes``, e.g.
    ``{"tp": 1}``, else the saved ones)? The mesh, the tensor shapes (every rank needs rows) and
    the one batch plan (``core.reshard_plan.plan_resume``, the same the resume applies)."""
    manifest = store.read_manifest(step)
    mesh = mesh_for(world_size, manifest.layout, sizes)
    problems = check_shapes(tensor_shapes(store, step), world_size)
    if problems:
        raise MisfitError(
            f"step {step} cannot be sharded over {world_size} ranks: "
            + "; ".join(map(str, problems[:3]))
            + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""),
            f"use at most {min(p.rows for p in problems)} ranks",
            ExitCode.CONFLICT,
        )
    plan = plan_resume(manifest.batch, manifest.layout, manifest.lineage, mesh, micro_batch=micro_batch)
    rank0 = store.step_path(step) / layout.rank_state_name(0)
    data = state_codec.loads(rank0.read_bytes(), str(rank0)).get("data") if rank0.exists() else None
    return ReshardReport(step, manifest.world_size, world_size, plan, data)


def record_plan(store: CheckpointStore, report: ReshardReport) -> None:
    """Append the plan to the manifest's lineage (atomic rewrite, under the directory's lock)."""
    manifest = store.read_manifest(report.step)
    entry = {
        "event": "reshard_plan",
        "time": time.time(),
        "world_size": report.new_world_size,
        "mesh": [[n, s] for n, s in report.new_mesh.dims],
        "batch": report.plan.to_json()["new"],
    }
    store.rewrite_manifest(
        report.step,
        replace(manifest, lineage=(*manifest.lineage, entry)),
        "reshard_plan",
        world_size=report.new_world_size,
        batch=entry["batch"],
    )
