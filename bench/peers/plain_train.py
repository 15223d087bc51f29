"""The peers benchmark's training (``workload``) as most users start: ``torchrun --max-restarts N``
restarts the whole group when a rank exits, and the script saves torch DCP checkpoints every
``SAVE_EVERY`` steps and loads the newest at its start (``workload.dcp_save``/``dcp_resume``). No
hang detection: a frozen rank blocks the others in their next collective until gloo's timeout.

    torchrun --nproc-per-node 2 --max-restarts 3 bench/peers/plain_train.py CKPT_DIR STEPS_DIR STEPS
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as dist
import workload
from torch.nn.parallel import DistributedDataParallel

COLLECTIVE_TIMEOUT = timedelta(minutes=30)  # torch's default for gloo: a hang is found only after it


def main(argv: list[str]) -> None:
    args = workload.parse(argv)
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    rank, _ = workload.rank_world()
    model = DistributedDataParallel(workload.build())
    opt = workload.optimizer(model)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    start = workload.dcp_resume(model, opt, args.ckpt_dir)
    log = workload.StepLog(args.steps_dir, rank)
    for step in range(start + 1, args.steps + 1):
        loss = workload.train_step(model, opt, step, rank)
        if step % workload.SAVE_EVERY == 0:
            workload.dcp_save(model, opt, args.ckpt_dir, step)
        log.step(step, loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
