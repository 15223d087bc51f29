"""``ckpt reshard --out DIR2`` runs this under torchrun with the new world size (gloo).

Every rank builds empty targets from the source's DCP metadata (no user model needed): sharded
tensors as DTensors ``Shard(0)`` over the new ranks, scalars and the probe batch replicated,
non-tensor entries as placeholders. DCP loads the source into them (each file hash-checked as
it is read), then each rank writes only its own slice and the result is committed with the same
protocol and hashes as any checkpoint. DCP files hold global tensors, so this even split of
every tensor loads on any mesh; the manifest records the new mesh (``TP`` and data parallel
the rest), which the resume plans against. Each new rank's JSON state is taken as a resume on
that mesh would take it (``training.rank_state.read_rank_state``: keyed by mesh coordinates).

    torchrun --standalone --nproc-per-node N -m ckpt_tool.entrypoints.reshard RESULT.json SRC STEP DST TP [MICRO_BATCH]
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor import empty as dtensor_empty

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.entrypoints import run_and_report
from ckpt_tool.ops.reshard import check_reshard
from ckpt_tool.store.checksums import binding_seed
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import state_codec
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.commit import commit_staged
from ckpt_tool.training.config import DEFAULT_IO_THREADS
from ckpt_tool.training.distributed import init_distributed
from ckpt_tool.training.hashing_fs import HashingFileSystem
from ckpt_tool.training.rank_state import read_rank_state
from ckpt_tool.training.safe_dcp import load_metadata_safely, load_state


def _targets(metadata: Any, mesh: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for key, md in metadata.state_dict_metadata.items():
        path = (metadata.planner_data or {}).get(key, (key,))
        if isinstance(md, TensorStorageMetadata):
            sharded = len(md.size) >= 1 and (key.startswith(("model.", "optim.state.")))
            dtype = md.properties.dtype
            value = (
                dtensor_empty(tuple(md.size), dtype=dtype, device_mesh=mesh, placements=[Shard(0)])
                if sharded
                else torch.empty(tuple(md.size), dtype=dtype)
            )
        else:
            value = None  # a non-tensor entry (optimizer hyper-parameters): loaded as plain data
        set_element(state, path, value)
    return state


def main(argv: list[str]) -> int:
    result_path, src, step, dst, tp = Path(argv[0]), Path(argv[1]), int(argv[2]), Path(argv[3]), int(argv[4])
    micro = int(argv[5]) if len(argv) > 5 else None
    init_distributed("gloo")
    comm = Comm()

    def body() -> dict[str, object]:
        try:
            reshard_copy(comm, src, step, dst, tp, micro)
        finally:
            comm.close()
        return {"step": step, "out": str(dst), "world_size": comm.world_size}

    return run_and_report(result_path, body)


def reshard_copy(comm: Comm, src: Path, step: int, dst: Path, tp: int, micro: int | None) -> None:
    """Load step ``step`` of ``src`` into targets laid out for this world size and commit it in
    ``dst``, for a mesh of tensor-parallel size ``tp`` and data parallel the rest."""
    store, world = CheckpointStore(src), comm.world_size
    manifest = store.read_manifest(step)
    report = check_reshard(store, step, world, micro, {"tp": tp})
    path = store.step_path(step)
    verify_fs = HashingFileSystem(lambda n: binding_seed(manifest.run_id, step, n), {f.path: f for f in manifest.files})
    with verify_fs.create_stream(path / layout.DCP_METADATA_NAME, "rb") as f:
        metadata = load_metadata_safely(f)
    state = _targets(metadata, init_device_mesh("cpu", (world,)))
    load_state(state, path, process_group=comm.group, verify_with=verify_fs)
    rank_state = read_rank_state(path, verify_fs, comm.rank, report.new_mesh, manifest.layout)

    def create() -> None:
        CheckpointStore(dst, create=True)

    comm.on_coordinator(create)
    out = CheckpointStore(dst)
    partial = out.begin_staging(step)
    writer = FileSystemWriter(partial, single_file_per_rank=True, sync_files=True, thread_count=DEFAULT_IO_THREADS, overwrite=True)
    writer.fs = HashingFileSystem(lambda n: binding_seed(manifest.run_id, step, n))
    dcp.save(state, storage_writer=writer, process_group=comm.group)
    lineage = (
        *manifest.lineage,
        {"event": "resharded_from", "time": time.time(), "source": str(src.absolute()), "step": step, "world_size": manifest.world_size},
    )

    def make_manifest(files: tuple[FileEntry, ...]) -> Manifest:
        # env keeps what produced the state (the original world size): a resume compares against it
        return replace(
            manifest,
            files=files,
            world_size=world,
            batch=report.plan.new,
            mesh=report.new_mesh,
            lineage=lineage,
            created_at=time.time(),
        )

    commit_staged(out, comm, step, manifest.run_id, writer.fs, state_codec.dumps(rank_state), make_manifest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
