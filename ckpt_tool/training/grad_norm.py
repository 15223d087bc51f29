"""Gradient norms of models whose parameters live on several device meshes.

Under tensor parallel x FSDP, the tensor-parallel parameters are DTensors on the 2-D mesh and
the others (norms, embeddings) on its data-parallel sub-mesh; torch's ``get_total_norm`` and
``clip_grad_norm_`` stack the per-tensor norms and refuse DTensors of different meshes. These
take the norm per mesh, reduce each to a plain tensor and combine them, in a fixed order (the
order the parameters come in), so the result is the same on every rank and every run.

``local_norm`` is the other question: the norm of what this rank holds (its shards), with no
collective; a rank's own value, for the anomaly checks (``CheckpointManager.maybe_save(step,
metrics=...)``), where a corrupted shard must change this rank's value and no other's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def _mesh_key(t: torch.Tensor) -> object:
    mesh = getattr(t, "device_mesh", None)
    return None if mesh is None else (mesh.device_type, tuple(mesh.mesh.flatten().tolist()), tuple(mesh.mesh.shape), mesh.mesh_dim_names)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _by_mesh(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[object, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(_mesh_key(t), []).append(t)
    return list(groups.values())


def total_norm(tensors: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type`` norm of all ``tensors`` together, as a plain tensor (replicated on every rank)."""
    groups = _by_mesh(tensors)
    if not groups:
        return torch.zeros(())
    norms = [_full(torch.nn.utils.get_total_norm(g, norm_type=norm_type)) for g in groups]
    if len(norms) == 1:  # one mesh: torch's own value, bit for bit
        return norms[0]
    return torch.nn.utils.get_total_norm(norms, norm_type=norm_type)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters on several meshes; returns the total norm."""
    params = [p for p in parameters if p.grad is not None]
    norm = total_norm([p.grad for p in params], norm_type)
    for group in _by_mesh(params):  # torch scales with one foreach op, which refuses several meshes
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


def local_norm(tensors: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type`` norm of this rank's own pieces of ``tensors`` (a DTensor's local shard, a
    plain tensor whole), as a plain tensor; no collective, so each rank's value is its own."""
    pieces = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    if not pieces:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm([p.detach() for p in pieces], norm_type=norm_type)
