"""The peers benchmark's training (``workload``) as most users start: ``torchrun --max-restarts N``
restarts the whole group when a rank exits, and the script saves torch DCP checkpoints every
``SAVE_EVERY`` steps and loads the newest at its start (``workload.dcp_training``). No hang
detection: a frozen rank blocks the others in their next collective until gloo's 30-minute timeout.

    torchrun --nproc-per-node 2 --max-restarts 3 bench/peers/plain_train.py CKPT_DIR STEPS_DIR STEPS
"""

from __future__ import annotations

import sys

import workload

if __name__ == "__main__":
    workload.dcp_training(workload.parse(sys.argv[1:]))
