"""RNG states of one rank: python, numpy (when installed), torch CPU and every CUDA device.

DTensor's random ops (dropout on a DTensor under tensor parallel) draw from the default CUDA
generator through torch's ``OffsetBasedRNGTracker``, which keeps no state of its own (torch
2.13): the CUDA states restore it. What matters is that it existed: created lazily at the first
random DTensor op, it broadcasts rank 0's generator state to every rank (``_dispatch.py``), which
the uninterrupted run did once, at its first such op. A resumed run that created it again would
overwrite the restored per-rank states at its first step, so ``restore`` creates it beforehand,
without that broadcast, when the checkpoint says it existed. (It supports CUDA-like devices only:
on CPU it is never created and DTensor random ops use each rank's own generator.)
"""

from __future__ import annotations

import random
from typing import Any

import torch

try:  # numpy is optional: torch does not require it
    import numpy as np
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    np = None


def _dtensor_random() -> Any:
    try:
        from torch.distributed.tensor import _random
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return _random


def capture() -> dict[str, Any]:
    """This rank's RNG states: python, torch CPU, numpy when installed, every CUDA device when CUDA is
    initialised, and whether DTensor's RNG tracker exists (``restore`` recreates it)."""
    tracker = getattr(_dtensor_random(), "_rng_tracker", None)
    state: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state(), "dtensor_rng_tracker": tracker is not None}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any], device_mesh: Any = None) -> None:
    """Put ``state`` back; ``device_mesh`` (the run's, when it gave one) lets DTensor's RNG tracker
    be recreated without its broadcast (see the module docstring)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_cpu"])
    if np is not None and "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state(
            (name, keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
        )
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) != torch.cuda.device_count():
            raise RuntimeError(f"checkpoint holds RNG states of {len(states)} CUDA devices, this process sees {torch.cuda.device_count()}")
        torch.cuda.set_rng_state_all(states)
    dtensor_random = _dtensor_random()
    if state.get("dtensor_rng_tracker") and device_mesh is not None and dtensor_random is not None and dtensor_random._rng_tracker is None:
        if dtensor_random.is_rng_supported_mesh(device_mesh):
            dtensor_random._rng_tracker = dtensor_random.OffsetBasedRNGTracker(device_mesh, run_state_sync=False)
