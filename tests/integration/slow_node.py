"""The reference recipe, with the rank on node $SLOW_NODE (SLURMD_NODENAME) made slow: 300 ms
more compute a step (a test hook for a straggler whose rank number the rendezvous decides)."""

from __future__ import annotations

import os
import sys

from ckpt_tool.recipes import tiny_gpt

if __name__ == "__main__":
    if os.environ.get("SLURMD_NODENAME") == os.environ.get("SLOW_NODE"):
        sys.argv += ["--slow-rank", os.environ.get("RANK", "0"), "--slow-ms", "300", "--slow-from-step", "5"]
    sys.exit(tiny_gpt.main())
