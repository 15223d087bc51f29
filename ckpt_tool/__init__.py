"""ckpt-tool: checkpointing and fault recovery for distributed PyTorch training on SLURM.

The training-side API, imported lazily (the ``ckpt`` CLI does not pay for torch unless needed)::

    from ckpt_tool import CheckpointConfig, CheckpointManager, init_distributed, heartbeat
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointConfig": "ckpt_tool.training.config",
    "CheckpointManager": "ckpt_tool.training.manager",
    "ProbeSpec": "ckpt_tool.training.probe",
    "BatchConfig": "ckpt_tool.core.batch",
    "BatchRequest": "ckpt_tool.core.batch",
    "RetentionPolicy": "ckpt_tool.core.retention",
    "CkptError": "ckpt_tool.errors",
    "ExitCode": "ckpt_tool.errors",
    "heartbeat": "ckpt_tool.training.heartbeat",
    "init_distributed": "ckpt_tool.training.distributed",
    "submit": "ckpt_tool.slurm.submit",
    "Mesh": "ckpt_tool.core.mesh",
    "from_device_mesh": "ckpt_tool.training.mesh",
    "clip_grad_norm": "ckpt_tool.training.grad_norm",
    "local_norm": "ckpt_tool.training.grad_norm",
    "AnomalyPolicy": "ckpt_tool.core.anomaly",
    "Verdict": "ckpt_tool.core.anomaly",
    "GlobalSampler": "ckpt_tool.training.sampler",
    "micro_batch_indices": "ckpt_tool.training.sampler",
}
__all__ = [
    "__version__",
    "CheckpointConfig",
    "CheckpointManager",
    "ProbeSpec",
    "BatchConfig",
    "BatchRequest",
    "RetentionPolicy",
    "CkptError",
    "ExitCode",
    "heartbeat",
    "init_distributed",
    "submit",
    "Mesh",
    "from_device_mesh",
    "clip_grad_norm",
    "local_norm",
    "AnomalyPolicy",
    "Verdict",
    "GlobalSampler",
    "micro_batch_indices",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ckpt_tool' has no attribute {name!r}")
