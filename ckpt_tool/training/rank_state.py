"""What each rank saves besides DCP's model and optimizer: RNG states, scheduler, grad scaler,
data position, the step and the user's extras, in ``rank_R.state.json`` (JSON, never pickle)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ckpt_tool.core import layout
from ckpt_tool.core.mesh import Mesh, source_rank
from ckpt_tool.training import rng, state_codec
from ckpt_tool.training.config import Stateful
from ckpt_tool.training.hashing_fs import HashingFileSystem


@dataclass
class TrainingState:
    """The user's objects a checkpoint holds (model and optimizer go through DCP)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any | None = None
    scaler: Any | None = None
    data: Stateful | None = None
    device_mesh: Any = None  # the run's torch DeviceMesh, when it gave one (DTensor's RNG tracker)

    def capture(self, step: int, extra: dict[str, Any] | None) -> dict[str, Any]:
        """This rank's non-tensor state at ``step``: RNG states, the scheduler's, scaler's and data's
        ``state_dict()`` (None when absent) and the user's ``extra``. Encode it with
        ``state_codec.dumps``."""
        return {
            "step": step,
            "rng": rng.capture(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "data": self.data.state_dict() if self.data is not None else None,
            "extra": extra or {},
        }

    def restore(self, state: dict[str, Any]) -> dict[str, Any]:
        """Put a captured state back; returns the user's extras."""
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        rng.restore(state["rng"], self.device_mesh)
        return state.get("extra") or {}


def read_rank_state(path: Path, verify_fs: HashingFileSystem, rank: int, mesh: Mesh, saved: Mesh) -> dict[str, Any]:
    """Rank ``rank``'s state of the checkpoint in ``path``, hash-checked as it is read.

    Keyed by mesh coordinates (``core.mesh.source_rank``): on the same mesh each rank takes its
    own; when only model-parallel sizes changed (tp 2 -> 1), each rank takes all of the state of
    the old rank at its data-parallel coordinate, so a per-rank data position stays with its
    samples; when the data-parallel size changed, the job-wide parts (data position, scheduler,
    counters, extras: every rank's are equal, so the data position must be global) come from old
    rank 0 and the RNG streams from the old rank at its coordinates (a reshard is not bit-exact
    anyway)."""

    def read(r: int) -> dict[str, Any]:
        f = path / layout.rank_state_name(r)
        return state_codec.loads(verify_fs.read_verified(f), str(f))

    source = source_rank(saved, mesh, rank)
    if saved.same_data_layout(mesh):
        return read(source)
    state = read(0)
    state["rng"] = read(source)["rng"]
    return state
