"""The peers benchmark's training (``workload``) under NVIDIA's resiliency extension 0.4.1, as its
documentation writes it: launched by ``ft_launcher`` (in-job restarts, ``--max-restarts``), each
rank a ``RankMonitorClient`` that sends a heartbeat every step; the checkpoints are the same plain
torch DCP ones as ``plain_train.py`` (``workload.dcp_training``; NVRx's own checkpointing needs its
async CUDA path).

    ft_launcher --nproc-per-node 2 --max-restarts 3 --ft-initial-rank-heartbeat-timeout 60 \\
        --ft-rank-heartbeat-timeout 5 --ft-workload-check-interval 1 --ft-enable-nic-monitor false \\
        bench/peers/nvrx_train.py CKPT_DIR STEPS_DIR STEPS
"""

from __future__ import annotations

import sys

import workload
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

if __name__ == "__main__":
    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()  # after torchrun's environment is there; the process group comes in dcp_training
    workload.dcp_training(workload.parse(sys.argv[1:]), after_step=monitor.send_heartbeat)
    monitor.shutdown_workload_monitoring()
