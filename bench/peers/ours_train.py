"""The peers benchmark's training (``workload``) with ckpt-tool, as its README's quick start writes
it: ``init_distributed``, a ``CheckpointManager`` (async saves every ``SAVE_EVERY`` steps,
hash-checked resume), ``maybe_save`` once per step. Run under ``ckpt run --nproc-per-node 2 --
bench/peers/ours_train.py CKPT_DIR STEPS_DIR STEPS`` (the watchdog: crash and hang detection,
restarts in place)."""

from __future__ import annotations

import sys

import workload
from torch.nn.parallel import DistributedDataParallel

from ckpt_tool import CheckpointConfig, CheckpointManager, init_distributed


def main(argv: list[str]) -> None:
    args = workload.parse(argv)
    init_distributed()
    rank, _ = workload.rank_world()
    model = DistributedDataParallel(workload.build())
    opt = workload.optimizer(model)
    mgr = CheckpointManager(CheckpointConfig(args.ckpt_dir, save_every=workload.SAVE_EVERY, async_save=True, quiet=True), model, opt)
    start = mgr.resume() or 0
    log = workload.StepLog(args.steps_dir, rank)
    for step in range(start + 1, args.steps + 1):
        loss = workload.train_step(model, opt, step, rank)
        mgr.maybe_save(step)
        log.step(step, loss)
    mgr.close()


if __name__ == "__main__":
    main(sys.argv[1:])
