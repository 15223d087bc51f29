"""The few collectives the checkpoint manager needs, on its own gloo group.

The manager's group is separate from the training's default group: an async save runs its
collectives in a background thread, and sharing the default group with FSDP's collectives
crashes gloo ("collective mismatch"). Without torch.distributed everything degrades to one rank.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


class Comm:
    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        if self.distributed:
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self.group = dist.new_group(backend="gloo")
        else:
            self.rank, self.world_size, self.group = 0, 1, None

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def all_gather(self, value: T) -> list[T]:
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Destroy the manager's group before the default one goes (gloo aborts otherwise)."""
        if self.distributed and self.group is not None and dist.is_initialized():
            dist.destroy_process_group(self.group)
            self.group = None
