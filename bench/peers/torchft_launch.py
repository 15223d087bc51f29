"""Start a torchft job for the peers benchmark: a local ``torchft_lighthouse`` and two replica
groups, each ``torchrun --nproc-per-node 1 --max-restarts 3 torchft_train.py`` with its own
``REPLICA_GROUP_ID`` and master port; wait for both groups, then stop the lighthouse.

    torchft_launch.py CKPT_DIR STEPS_DIR STEPS       (run with the torchft venv's python)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> int:
    lighthouse_port = free_port()
    lighthouse = subprocess.Popen(
        [
            str(BIN / "torchft_lighthouse"),
            "--min_replicas",
            "1",
            "--quorum_tick_ms",
            "100",
            "--join_timeout_ms",
            "10000",
            "--bind",
            f"127.0.0.1:{lighthouse_port}",
        ],  # fmt: skip
    )
    time.sleep(0.5)
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{lighthouse_port}"}
    groups = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--master-port",
                str(free_port()),
                "--nnodes",
                "1",
                "--nproc-per-node",
                "1",
                "--max-restarts",
                "3",
                str(HERE / "torchft_train.py"),
                *argv,
            ],  # fmt: skip
            env={**env, "REPLICA_GROUP_ID": str(g)},
        )
        for g in (0, 1)
    ]
    codes = [g.wait() for g in groups]
    lighthouse.terminate()
    lighthouse.wait()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
