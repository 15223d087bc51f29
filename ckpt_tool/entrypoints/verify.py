"""``ckpt verify --nproc N`` runs this under torchrun: every rank loads its shard, rank 0 reports.

torchrun --standalone --nproc-per-node N -m ckpt_tool.entrypoints.verify RESULT.json DIR STEP [ENTRY]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from ckpt_tool.entrypoints import run_and_report
from ckpt_tool.ops.verify import verify_checkpoint
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.distributed import init_distributed


def main(argv: list[str]) -> int:
    result_path, directory, step = Path(argv[0]), Path(argv[1]), int(argv[2])
    entry = argv[3] if len(argv) > 3 else None
    init_distributed("gloo")
    return run_and_report(
        result_path, lambda: verify_checkpoint(CheckpointStore(directory), step, entry, world_size=dist.get_world_size()).to_json()
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
