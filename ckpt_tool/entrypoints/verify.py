"""``ckpt verify --nproc N [--tp T]`` runs this under torchrun: every rank loads its shard, rank 0 reports.

torchrun --standalone --nproc-per-node N -m ckpt_tool.entrypoints.verify RESULT.json DIR STEP TP REPLICATE [ENTRY]

The device mesh is ``(N / T, T)`` named ``("dp_shard", "tp")``, the layout the reference recipe
and torchtitan use, or with REPLICATE > 1 the HSDP mesh ``(R, N / T / R, T)`` named
``("dp_replicate", "dp_shard", "tp")``; the entry point shards the model on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from ckpt_tool.entrypoints import run_and_report
from ckpt_tool.ops.verify import verify_checkpoint
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.distributed import init_distributed
from ckpt_tool.training.mesh import from_device_mesh, init_dp_tp_mesh


def main(argv: list[str]) -> int:
    """torchrun's entry for ``ckpt verify --nproc``: ``argv`` is RESULT.json DIR STEP TP REPLICATE [ENTRY]. Every
    rank loads its shard on the mesh (module docstring) and re-measures the probe; rank 0 writes the report or
    error to RESULT.json. Returns the exit code."""
    result_path, directory, step, tp, replicate = Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    entry = argv[5] if len(argv) > 5 else None
    init_distributed("gloo")
    world = dist.get_world_size()
    device_mesh = init_dp_tp_mesh(world, tp, replicate=replicate)
    mesh = from_device_mesh(device_mesh)
    return run_and_report(result_path, lambda: verify_checkpoint(CheckpointStore(directory), step, entry, mesh, device_mesh).to_json())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
