"""A checkpoint laid out for N ranks, written by one process (``ckpt reshard --out``).

The source is loaded once, whole, into plain tensors: each file read once, hash-checked as it is
read (``safe_dcp.load_state``). DCP's own save protocol then runs for N virtual ranks in this
process: each rank's plan holds its rows of every sharded tensor (the split ``Shard(0)`` gives on
N ranks, as ``entrypoints.reshard_copy`` writes with N real ranks) and rank 0 holds the rest; DCP's
planner checks that the plans cover every tensor exactly once and builds the metadata, and its
``FileSystemWriter`` writes ``__R_0.distcp`` for each R. The files are the ones N ranks saving the
same state would write, so torch's ``dcp.load`` and ``dcp_to_torch_save`` read them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._traverse import get_element, set_element
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import _create_write_items
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor import empty as dtensor_empty

SHARDED_PREFIXES = ("model.", "optim.state.")


def is_sharded(key: str, size: tuple[int, ...]) -> bool:
    """Entries split over the ranks by rows; everything else (scalars, the probe batch,
    hyper-parameters) is replicated."""
    return len(size) >= 1 and key.startswith(SHARDED_PREFIXES)


def empty_targets(metadata: Metadata, mesh: DeviceMesh | None) -> dict[str, Any]:
    """Empty tensors for every entry of a checkpoint's metadata, nested as saved: sharded
    entries as DTensors ``Shard(0)`` over ``mesh`` (whole tensors without one), non-tensor
    entries as placeholders DCP loads as plain data."""
    state: dict[str, Any] = {}
    for key, md in metadata.state_dict_metadata.items():
        path = (metadata.planner_data or {}).get(key, (key,))
        value: Any = None
        if isinstance(md, TensorStorageMetadata):
            size, dtype = tuple(md.size), md.properties.dtype
            if mesh is not None and is_sharded(key, size):
                value = dtensor_empty(size, dtype=dtype, device_mesh=mesh, placements=[Shard(0)])
            else:
                value = torch.empty(size, dtype=dtype)
        set_element(state, path, value)
    return state


def rows_of(rows: int, world: int, rank: int) -> tuple[int, int]:
    """(first row, number of rows) of ``rank`` when ``Shard(0)`` splits ``rows`` over ``world``."""
    length, offset = Shard.local_shard_size_and_offset(rows, world, rank)
    return int(offset), int(length)


class _RankPlanner(DefaultSavePlanner):
    """One virtual rank's part: its rows of the sharded entries; on rank 0 also the rest."""

    def __init__(self, flat: dict[str, Any], mappings: dict[str, Any], rank: int, world: int) -> None:
        super().__init__(flatten_state_dict=True)
        self.flat, self.mappings, self.rank, self.world = flat, mappings, rank, world
        self.data: dict[MetadataIndex, Any] = {}

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        self.state_dict, self.is_coordinator = self.flat, is_coordinator

    def create_local_plan(self) -> SavePlan:
        items: list[WriteItem] = []
        for fqn, value in self.flat.items():
            if isinstance(value, torch.Tensor) and is_sharded(fqn, tuple(value.shape)):
                first, length = rows_of(value.shape[0], self.world, self.rank)
                if length == 0:
                    continue
                offsets = torch.Size((first, *[0] * (value.dim() - 1)))
                part = value.narrow(0, first, length)
                item = WriteItem(
                    index=MetadataIndex(fqn, offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=offsets, sizes=part.shape),
                        properties=TensorProperties.create_from_tensor(value),
                        size=value.shape,
                    ),
                )
                self.data[item.index] = part
                items.append(item)
            elif self.rank == 0:
                for item in _create_write_items(fqn, value):
                    self.data[item.index] = value
                    items.append(item)
        self.plan = SavePlan(items, planner_data=self.mappings)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        return self.data[index]


def write_layout(flat: dict[str, Any], mappings: dict[str, Any], world: int, writer: FileSystemWriter) -> Metadata:
    """DCP's save protocol (plan on every rank, global plan and metadata on rank 0, write, finish)
    for ``world`` virtual ranks in this process; ``flat`` holds the whole state, keyed as DCP
    flattens it. Returns the metadata written. Run inside ``HashingFileSystem.writers_settled``."""
    planners = [_RankPlanner(flat, mappings, rank, world) for rank in range(world)]
    local_plans = []
    for rank, planner in enumerate(planners):
        planner.set_up_planner({}, is_coordinator=rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        local_plans.append(writer.prepare_local_plan(planner.create_local_plan()))
    global_plans, metadata = planners[0].create_global_plan(local_plans)
    global_plans = writer.prepare_global_plan(global_plans)
    results = []
    for rank, planner in enumerate(planners):
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        writes = writer.write_data(planner.finish_plan(global_plans[rank]), planner)
        writes.wait()
        results.append(writes.value())
    writer.set_up_storage_writer(True, rank=0, use_collectives=True)
    writer.finish(metadata, results)
    return metadata


def flatten_loaded(state: dict[str, Any], metadata: Metadata) -> dict[str, Any]:
    """The loaded nested state keyed by the checkpoint's flat keys (DCP's flattening)."""
    mappings = metadata.planner_data or {}
    return {key: get_element(state, mappings.get(key, (key,))) for key in metadata.state_dict_metadata}
