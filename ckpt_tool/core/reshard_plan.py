"""Resharding plans: a new mesh with the same global batch and the same data order. Pure.

The global batch G = micro-batch x grad accumulation x data-parallel size is what the
optimisation sees; it is never changed silently. On a new data-parallel size the plan keeps the
micro-batch when it can (more accumulation on fewer ranks), else picks the largest micro-batch
that divides exactly; when G itself is not divisible by the new size it refuses and lists the
nearest sizes that work and the nearest global batches for the requested size. The mesh must
fit the model (the limits the run recorded, e.g. tp divides the heads) and may change only in
the dimensions that allow it (``core.mesh.DIMENSIONS``).

Data order: the sampler position is global (samples of the epoch's permutation consumed by the
whole job), so it does not depend on the mesh. At each step the G samples
``perm[p : p + G]`` are split into micro-batches; data-parallel rank r's micro-batch a is the
slice ``[p + (a * dp + r) * B, p + (a * dp + r + 1) * B)`` (every rank of one data-parallel
group, e.g. the tensor-parallel peers, takes the same slice). ``step_slices`` gives that map;
the slices of one step tile ``[p, p + G)`` exactly, whatever the mesh: no sample skipped or
repeated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_tool.core.batch import BatchConfig, BatchRequest
from ckpt_tool.core.mesh import DIMENSIONS, Mesh, nearest, require_fit
from ckpt_tool.errors import CkptError, ExitCode, MisfitError


@dataclass(frozen=True)
class ReshardPlan:
    """The batch split before and after a mesh change: same global batch, the mesh's new sizes."""

    old: BatchConfig
    new: BatchConfig
    old_mesh: Mesh | None = None
    new_mesh: Mesh | None = None

    @property
    def changed(self) -> bool:
        """True when the resume must apply the plan (the batch split or the mesh differs)."""
        return self.old != self.new or self.old_mesh != self.new_mesh

    def to_json(self) -> dict[str, object]:
        """The plan as a manifest's lineage and ``ckpt reshard --json`` record it."""

        def b(x: BatchConfig) -> dict[str, int]:
            return {"micro_batch": x.micro_batch, "grad_accum": x.grad_accum, "dp_size": x.dp_size, "global_batch": x.global_batch}

        out: dict[str, object] = {"old": b(self.old), "new": b(self.new)}
        if self.old_mesh is not None and self.new_mesh is not None:
            out["mesh"] = {"old": self.old_mesh.compact(), "new": self.new_mesh.compact()}
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_batch(
    old: BatchConfig, new_dp: int, micro_batch: int | None = None, prefer: int | None = None, ranks_per_dp: int = 1
) -> ReshardPlan:
    """Keep the global batch on ``new_dp`` data-parallel ranks.

    ``micro_batch`` is a demand (``--micro-batch``): refused when it does not divide the per-rank
    share. ``prefer`` is a wish (the run's own micro-batch): kept when it divides, else the
    largest micro-batch below it that does. Without either, the old micro-batch is the wish.
    ``ranks_per_dp`` (the model-parallel size, e.g. tp) turns data-parallel sizes into world
    sizes in the refusal's hint."""
    if not isinstance(new_dp, int) or isinstance(new_dp, bool) or new_dp < 1:
        raise CkptError(f"world size must be a positive integer, got {new_dp!r}", "e.g. --world-size 48", ExitCode.USAGE)
    g = old.global_batch
    if g % new_dp:
        near_sizes = nearest(_divisors(g), new_dp)
        multiples = sorted({m for m in ((g // new_dp) * new_dp, (g // new_dp + 1) * new_dp) if m > 0})
        sizes = " or ".join(map(str, near_sizes))
        if ranks_per_dp > 1:
            worlds = " or ".join(str(d * ranks_per_dp) for d in near_sizes)
            sizes += f", i.e. {worlds} ranks with {ranks_per_dp} ranks per data-parallel rank"
        raise MisfitError(
            f"global batch {g} cannot be split over {new_dp} data-parallel ranks ({g} is not divisible by {new_dp})",
            f"use a data-parallel size that divides {g} (nearest: {sizes}), "
            f"or change the global batch on purpose to {' or '.join(map(str, multiples))} (a multiple of {new_dp}; this changes the optimisation)",
        )
    per_rank = g // new_dp  # samples each rank handles per step = micro x accum
    if micro_batch is not None:
        if micro_batch < 1 or per_rank % micro_batch:
            raise CkptError(
                f"--micro-batch {micro_batch} does not divide the {per_rank} samples each of the {new_dp} data-parallel ranks handles per step (global batch {g})",
                f"micro-batches that do: {', '.join(map(str, _divisors(per_rank)))}",
                ExitCode.USAGE,
            )
        return ReshardPlan(old, BatchConfig(micro_batch, per_rank // micro_batch, new_dp))
    wanted = prefer or old.micro_batch
    micro = max(d for d in _divisors(per_rank) if d <= wanted)
    return ReshardPlan(old, BatchConfig(micro, per_rank // micro, new_dp))


def check_mesh_change(old: Mesh, new: Mesh) -> Mesh:
    """``new`` with the limits both meshes record, when a checkpoint of ``old`` may continue on it.

    Raises:
        CkptError: a dimension that cannot change did (pipeline stages, context parallel: exit 4),
            or the new sizes break a limit of the model (e.g. tp does not divide the heads: exit 4),
            with the nearest sizes that fit.
    """
    for name in dict.fromkeys(old.names + new.names):
        if not DIMENSIONS[name].resizable and old.size(name) != new.size(name):
            raise MisfitError(
                f"the checkpoint was saved with {name} {old.size(name)} and this run has {name} {new.size(name)}: "
                f"changing {DIMENSIONS[name].meaning} ({name}) is not supported",
                f"continue with {name} {old.size(name)}; data parallel (dp_shard, dp_replicate) and tp may change",
            )
    merged = new.with_limits(old.limits)
    require_fit(merged, ExitCode.CONFLICT)
    return merged


def recorded_plan(lineage: Sequence[Mapping[str, Any]], new_mesh: Mesh) -> BatchConfig | None:
    """The newest plan ``ckpt reshard --in-place`` recorded for ``new_mesh``, if any (an
    unreadable entry is ignored: the default plan applies). Entries from before meshes were
    recorded name a world size of data-parallel ranks only."""
    dims = [[n, s] for n, s in new_mesh.dims]
    for entry in reversed(lineage):
        if entry.get("event") != "reshard_plan":
            continue
        recorded = entry.get("mesh")
        if recorded != dims and not (recorded is None and entry.get("world_size") == new_mesh.world_size == new_mesh.dp_size):
            continue
        b = entry.get("batch")
        try:
            return BatchConfig(int(b["micro_batch"]), int(b["grad_accum"]), int(b["dp_size"]))  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            return None
    return None


def plan_resume(
    saved: BatchConfig | None,
    saved_mesh: Mesh,
    lineage: Sequence[Mapping[str, Any]],
    new_mesh: Mesh,
    micro_batch: int | None = None,
    requested: BatchRequest | None = None,
) -> ReshardPlan:
    """The one plan for continuing a checkpoint saved on ``saved_mesh`` on ``new_mesh``.

    ``ckpt recover`` (what the next start will do), ``ckpt reshard`` (dry run, ``--in-place``,
    ``--out``) and ``resume()`` all call this, so what a command reports is what the training does
    when its command is unchanged. The mesh must fit (``check_mesh_change``). The checkpoint's
    global batch wins: the same training command resumes on any allowed mesh. In order: an
    explicit ``micro_batch`` (``ckpt reshard --micro-batch``, a demand); a plan ``ckpt reshard
    --in-place`` recorded for this mesh; the command's own micro-batch (``requested.micro_batch``,
    when given) if it divides the new per-rank share, else the largest that does; without one,
    the saved micro-batch likewise (more accumulation on fewer ranks: the same memory per rank).
    Only a command that gives the global batch explicitly (``requested.global_batch``) and
    another one changes it: on purpose.
    """
    new_mesh = check_mesh_change(saved_mesh, new_mesh)
    new_dp = new_mesh.dp_size
    if saved is None:
        raise MisfitError(
            f"the checkpoint was written on mesh {saved_mesh.describe()} and records no batch split, so the global batch cannot be kept on {new_mesh.describe()}",
            "resume with the original mesh, or pass batch= to CheckpointManager when saving",
        )
    if requested is not None and requested.global_batch is not None and requested.global_batch != saved.global_batch:
        return ReshardPlan(saved, requested.resolve(new_dp), saved_mesh, new_mesh)  # --global-batch given: a deliberate change
    if micro_batch is None:
        recorded = recorded_plan(lineage, new_mesh)
        if recorded is not None and recorded.global_batch == saved.global_batch and recorded.dp_size == new_dp:
            return ReshardPlan(saved, recorded, saved_mesh, new_mesh)
    prefer = requested.micro_batch if requested is not None else None
    plan = plan_batch(saved, new_dp, micro_batch=micro_batch, prefer=prefer, ranks_per_dp=new_mesh.model_parallel_size)
    return ReshardPlan(plan.old, plan.new, saved_mesh, new_mesh)


def micro_batch_slice(batch: BatchConfig, dp_rank: int, micro: int, position: int = 0) -> tuple[int, int]:
    """[start, end) of the samples data-parallel rank ``dp_rank`` uses in accumulation step
    ``micro`` of the step starting at ``position``."""
    start = position + (micro * batch.dp_size + dp_rank) * batch.micro_batch
    return start, start + batch.micro_batch


def step_slices(position: int, batch: BatchConfig) -> dict[tuple[int, int], tuple[int, int]]:
    """(data-parallel rank, micro step) -> [start, end) in the epoch's permutation, for the step starting at ``position``."""
    return {
        (rank, micro): micro_batch_slice(batch, rank, micro, position) for micro in range(batch.grad_accum) for rank in range(batch.dp_size)
    }


@dataclass(frozen=True)
class ShapeProblem:
    """A tensor whose first dimension has fewer rows than there would be ranks."""

    name: str
    rows: int
    ranks: int

    def __str__(self) -> str:
        return f"{self.name}: dim 0 has {self.rows} rows, fewer than {self.ranks} ranks"


def check_shapes(shapes: dict[str, tuple[int, ...]], world_size: int) -> list[ShapeProblem]:
    """Problems that stop a load at ``world_size``: every sharded tensor (dim 0) needs at least
    one row per rank (FSDP2 shards dim 0; fewer rows leave ranks empty)."""
    return [ShapeProblem(name, shape[0], world_size) for name, shape in sorted(shapes.items()) if len(shape) >= 1 and shape[0] < world_size]


ONE_PROCESS_MEMORY_SHARE = 0.5  # an offline copy in one process may take this share of the free memory


def copy_in_one_process(state_bytes: int, available_memory: int, asked: bool | None) -> bool:
    """Whether ``ckpt reshard --out`` writes the copy from one process (the whole state in its
    memory, each source byte read once) or from one process per new rank under torchrun (each
    holding its share): as asked, else one process when the state takes at most
    ``ONE_PROCESS_MEMORY_SHARE`` of the available memory."""
    if asked is not None:
        return asked
    return state_bytes <= available_memory * ONE_PROCESS_MEMORY_SHARE
