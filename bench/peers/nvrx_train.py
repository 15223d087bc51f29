"""The peers benchmark's training (``workload``) under NVIDIA's resiliency extension 0.4.1, as its
documentation writes it: launched by ``ft_launcher`` (in-job restarts, ``--max-restarts``), each
rank a ``RankMonitorClient`` that sends a heartbeat every step; the checkpoints are the same plain
torch DCP ones as ``plain_train.py`` (NVRx's own checkpointing needs its async CUDA path).

    ft_launcher --nproc-per-node 2 --max-restarts 3 --ft-initial-rank-heartbeat-timeout 60 \\
        --ft-rank-heartbeat-timeout 5 --ft-workload-check-interval 1 --ft-enable-nic-monitor false \\
        bench/peers/nvrx_train.py CKPT_DIR STEPS_DIR STEPS
"""

from __future__ import annotations

import sys

import torch.distributed as dist
import workload
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch.nn.parallel import DistributedDataParallel


def main(argv: list[str]) -> None:
    args = workload.parse(argv)
    dist.init_process_group("gloo")
    rank, _ = workload.rank_world()
    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()
    model = DistributedDataParallel(workload.build())
    opt = workload.optimizer(model)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    start = workload.dcp_resume(model, opt, args.ckpt_dir)
    log = workload.StepLog(args.steps_dir, rank)
    for step in range(start + 1, args.steps + 1):
        loss = workload.train_step(model, opt, step, rank)
        if step % workload.SAVE_EVERY == 0:
            workload.dcp_save(model, opt, args.ckpt_dir, step)
        monitor.send_heartbeat()
        log.step(step, loss)
    monitor.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
