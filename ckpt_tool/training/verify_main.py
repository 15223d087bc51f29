"""``ckpt verify --nproc N`` runs this under torchrun: every rank loads its shard, rank 0 reports.

    torchrun --standalone --nproc-per-node N -m ckpt_tool.training.verify_main DIR STEP OUT.json [ENTRY]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.distributed import init_distributed
from ckpt_tool.training.verify import verify_step


def main(argv: list[str]) -> int:
    directory, step, out = Path(argv[0]), int(argv[1]), Path(argv[2])
    entry = argv[3] if len(argv) > 3 else None
    init_distributed("gloo")
    rank = dist.get_rank()
    try:
        report = verify_step(CheckpointStore(directory), step, entry, world_size=dist.get_world_size())
        result = report.to_json()
    except CkptError as exc:
        result = {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
