"""The few collectives the checkpoint manager needs, on its own gloo group.

The manager's group is separate from the training's default group: an async save runs its
collectives in a background thread, and sharing the default group with FSDP's collectives
crashes gloo ("collective mismatch"). Without torch.distributed everything degrades to one rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ckpt_tool.errors import CkptError

T = TypeVar("T")


class Comm:
    """The manager's collectives on its own gloo group (``control_group`` too with ``with_control``:
    main-thread agreement while the save group is busy in the background). Must be built on every rank,
    after ``init_process_group``; without torch.distributed it is one rank and every call is local."""

    def __init__(self, with_control: bool = False) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.control_group = None
        if self.distributed:
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self.group = dist.new_group(backend="gloo")
            if with_control:  # main-thread agreement while the save group may be busy in the background
                self.control_group = dist.new_group(backend="gloo")
        else:
            self.rank, self.world_size, self.group = 0, 1, None

    @property
    def is_coordinator(self) -> bool:
        """Whether this is rank 0 (the rank that writes the manifest, LATEST and the index)."""
        return self.rank == 0

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def on_coordinator(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 alone; every rank gets its result, or raises the ``CkptError``
        it raised (no rank is left waiting in a collective for a rank that failed)."""
        result: Any = None
        error: CkptError | None = None
        if self.is_coordinator:
            try:
                result = fn()
            except CkptError as exc:
                error = exc
        result, error = self.broadcast((result, error))
        if error is not None:
            raise error
        return result

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order (picklable objects). Collective: called on every rank."""
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def main_gather(self, value: T) -> list[T]:
        """``all_gather`` on the control group: for the main thread while the save group may be busy
        in the background (an async save's commit); the group's own ``all_gather`` without one."""
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.control_group or self.group)
        return out

    def main_barrier(self) -> None:
        """``barrier`` on the control group (see ``main_gather``)."""
        if self.distributed:
            dist.barrier(group=self.control_group or self.group)

    def step_sync(self, flag: bool, values: list[float]) -> tuple[bool, list[float]]:
        """(True on every rank when ``flag`` is true on any, the maximum of each of ``values`` over
        the ranks): one collective on the control group, from the main thread. It is the step's
        synchronising collective under ``ckpt run``; ``training.step_timing`` rides on it."""
        if not self.distributed or self.control_group is None:
            return flag, list(values)
        t = torch.tensor([1.0 if flag else 0.0, *values], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control_group)
        reduced = t.tolist()
        return reduced[0] > 0, reduced[1:]

    def barrier(self) -> None:
        """Wait until every rank reaches this point (on the manager's group). Collective."""
        if self.distributed:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Destroy the manager's group before the default one goes (gloo aborts otherwise)."""
        if self.distributed and dist.is_initialized():
            for group in (self.group, self.control_group):
                if group is not None:
                    dist.destroy_process_group(group)
            self.group = self.control_group = None
