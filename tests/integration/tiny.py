"""A tiny single-process training setup for fast manager tests (no torchrun)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.manager import CheckpointManager
from ckpt_tool.training.probe import ProbeSpec


class Position:
    """A minimal stateful data position."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])


@dataclass
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: Position
    manager: CheckpointManager

    def step(self) -> float:
        g = torch.Generator().manual_seed(self.data.position)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        self.data.position += 1
        # RNG consumers of every kind: dropout (torch), python and numpy noise.
        noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
        loss = loss_fn(self.model, {"x": x, "y": y}) + noise
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        return float(loss)


def make_trainer(directory: Path, seed: int = 0, before_commit: Any = None, **config: Any) -> Trainer:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.2), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    data = Position()
    probe = ProbeSpec({"x": torch.ones(2, 16), "y": torch.zeros(2, 4)}, loss_fn)
    manager = CheckpointManager(
        CheckpointConfig(directory, **config),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=data,
        probe=probe,
        before_commit=before_commit,
    )
    return Trainer(model, optimizer, scheduler, data, manager)
