"""RNG states of one rank: python, numpy (when installed), torch CPU and every CUDA device."""

from __future__ import annotations

import random
from typing import Any

import torch

try:  # numpy is optional: torch does not require it
    import numpy as np
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    np = None


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
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
