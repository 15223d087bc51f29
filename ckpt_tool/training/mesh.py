"""The run's mesh, taken from what the training script passes (never guessed from the model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_tool.core.mesh import Mesh, limits_of, require_fit
from ckpt_tool.errors import CkptError, ExitCode


def from_device_mesh(device_mesh: Any, must_divide: Mapping[str, Mapping[str, int]] | None = None) -> Mesh:
    """A ``Mesh`` from a torch ``DeviceMesh`` built with named dimensions, e.g.
    ``init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp_shard", "tp"))``.

    Raises:
        CkptError: the dimensions are unnamed or named unknowingly, or the ranks are not laid out
            row-major (as ``init_device_mesh`` does) (exit 2).
    """
    names = device_mesh.mesh_dim_names
    if not names:
        raise CkptError(
            "the device mesh has no dimension names, so its data-parallel size is unknown",
            'build it with mesh_dim_names, e.g. init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp_shard", "tp"))',
            ExitCode.USAGE,
        )
    ranks = device_mesh.mesh.flatten().tolist()
    if ranks != list(range(len(ranks))):
        raise CkptError(
            f"the device mesh {dict(zip(names, device_mesh.mesh.shape, strict=True))} does not hold the ranks 0..{len(ranks) - 1} in row-major order",
            "build it with init_device_mesh over all ranks (ckpt-tool maps ranks to mesh coordinates in that order)",
            ExitCode.USAGE,
        )
    try:
        return Mesh.of(list(zip(names, (int(s) for s in device_mesh.mesh.shape), strict=True)), must_divide)
    except ValueError as exc:
        raise CkptError(f"device mesh: {exc}", "name the dimensions dp_shard (or dp), dp_replicate, tp, cp, pp", ExitCode.USAGE) from None


def init_dp_tp_mesh(world_size: int, tp: int, device_type: str = "cpu", replicate: int = 1) -> Any:
    """The ``(dp_shard, tp)`` DeviceMesh of all ranks, the layout the reference recipe and
    torchtitan use (tensor-parallel peers are neighbouring ranks: one node); with ``replicate``
    > 1 the ``(dp_replicate, dp_shard, tp)`` mesh of HSDP (each replica shards the model over
    ``dp_shard`` neighbouring ranks and the replicas keep the same shards).

    Raises:
        CkptError: ``tp`` (or ``replicate`` x ``tp``) does not divide the world size (exit 2).
    """
    if tp < 1 or world_size % tp:
        raise CkptError(
            f"--tp {tp} does not divide the {world_size} ranks of this job",
            f"use a --tp that divides {world_size}, or run a multiple of {tp} ranks",
            ExitCode.USAGE,
        )
    if replicate < 1 or (world_size // tp) % replicate:
        raise CkptError(
            f"--replicate {replicate} does not divide the {world_size // tp} data-parallel ranks of this job ({world_size} ranks / tp {tp})",
            f"use a --replicate that divides {world_size // tp}, or 1 (FSDP without replicas)",
            ExitCode.USAGE,
        )
    from torch.distributed.device_mesh import init_device_mesh

    if replicate > 1:
        shape = (replicate, world_size // tp // replicate, tp)
        return init_device_mesh(device_type, shape, mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp_shard", "tp"))


def run_mesh(spec: Any, world_size: int, must_divide: Mapping[str, Mapping[str, int]] | None = None) -> Mesh:
    """The mesh of this run from ``CheckpointManager(mesh=..., must_divide=...)``: a ``Mesh``, a
    torch ``DeviceMesh``, a mapping ``{"dp_shard": 2, "tp": 2}``, or None (1-D FSDP over all
    ranks); ``must_divide`` adds limits (``{"tp": {"attention heads": 32}}``).

    Raises:
        CkptError: it is not one of these, or its size is not the world size (exit 2).
    """
    if spec is None:
        mesh = Mesh.data_parallel(world_size)
    elif isinstance(spec, Mesh):
        mesh = spec
    elif isinstance(spec, Mapping):
        try:
            mesh = Mesh.of(spec)
        except ValueError as exc:
            raise CkptError(f"mesh {dict(spec)!r}: {exc}", "e.g. mesh={'dp_shard': 2, 'tp': 2}", ExitCode.USAGE) from None
    elif hasattr(spec, "mesh_dim_names") and hasattr(spec, "mesh"):
        mesh = from_device_mesh(spec)
    else:
        raise CkptError(
            f"mesh= takes a torch DeviceMesh, a ckpt_tool.Mesh or a mapping of sizes, not {type(spec).__name__}",
            "pass the DeviceMesh the model was sharded with",
            ExitCode.USAGE,
        )
    if mesh.world_size != world_size:
        raise CkptError(
            f"mesh {mesh.describe()} has {mesh.world_size} ranks, but this job has {world_size}",
            "pass the mesh of all ranks of this job (the one the model was sharded with)",
            ExitCode.USAGE,
        )
    if must_divide:
        try:
            mesh = mesh.with_limits(limits_of(must_divide))
        except ValueError as exc:
            raise CkptError(f"must_divide: {exc}", 'e.g. must_divide={"tp": {"attention heads": 32}}', ExitCode.USAGE) from None
    require_fit(mesh)
    return mesh
