"""The peers benchmark's training (``workload``) under torchft 0.2.0, as its DDP example writes it:
each replica group a torchrun of its own (here 1 rank each, ``REPLICA_GROUP_ID`` 0 and 1, started
by ``torchft_launch.py`` with a local ``torchft_lighthouse``); a ``Manager`` over a gloo process
group that forms a quorum each step, torchft's ``DistributedDataParallel`` and ``Optimizer``
wrappers. No checkpoint on disk: a group that comes back heals from a live peer's state. Its
step log is ``rank_<REPLICA_GROUP_ID>.jsonl``: the batch of a step is the one of that rank.

    torchft_train.py CKPT_DIR STEPS_DIR STEPS      (CKPT_DIR unused)
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

import torchft
import workload


def main(argv: list[str]) -> None:
    args = workload.parse(argv)
    group = int(os.environ["REPLICA_GROUP_ID"])
    model = workload.build()
    opt = workload.optimizer(model)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"peers_{group}",
        timeout=timedelta(seconds=10),
    )
    ddp = torchft.DistributedDataParallel(manager, model)
    ft_opt = torchft.Optimizer(manager, opt)
    log = workload.StepLog(args.steps_dir, group)
    while manager.current_step() < args.steps:
        step = manager.current_step() + 1
        ft_opt.zero_grad()
        loss = workload.gpt.lm_loss(ddp, workload.batch(step, group))
        loss.backward()
        ft_opt.step()
        log.step(step, float(loss.detach()))
    manager.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
