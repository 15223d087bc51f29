"""What a bit-identical resume depends on, and which differences break it. Pure.

Measured on this project's reference recipe (tests/integration/test_manager.py and README, 'When
is a resume bit-identical?'): the world
size, the intra-op thread count (LayerNorm gradients change bits between 1 and 2 threads), the
torch version and the parameter dtype all change the arithmetic. When one differs, the resume is
still correct but no longer bit-identical, and the user is told which and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRAJECTORY_KEYS: dict[str, str] = {
    "world_size": "a different world size changes the reduction order",
    "mesh": "a different mesh splits the matrix products and reductions differently",
    "threads": "a different intra-op thread count changes floating-point summation order",
    "torch": "a different torch version may change kernels",
    "dtype": "a different parameter dtype changes every operation",
    "device_type": "a different device type uses different kernels",
}


def trajectory_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Human-readable reasons why resuming ``saved`` under ``current`` will not be bit-identical."""
    reasons = []
    for key, why in TRAJECTORY_KEYS.items():
        if key in saved and key in current and saved[key] != current[key]:
            reasons.append(f"{key}: checkpoint {saved[key]!r}, now {current[key]!r} ({why})")
    return reasons


# How a check reproduces what the save ran under (``ckpt verify``): option or setting per key.
REPRODUCE: dict[str, str] = {
    "world_size": "--nproc {saved}",
    "tp": "--tp {saved}",
    "threads": "OMP_NUM_THREADS={saved}",
    "torch": "torch=={saved}",
}


def how_to_reproduce(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The options or settings that make a re-run match the save where it differs, e.g.
    ``["--nproc 2", "OMP_NUM_THREADS=1"]`` (dtype and device come from the model's own code)."""
    return [REPRODUCE[key].format(saved=saved[key]) for key in REPRODUCE if key in saved and key in current and saved[key] != current[key]]
