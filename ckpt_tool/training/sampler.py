"""The sampler a training script can use as ``data=``: its position is global, so a resume on any
number of ranks neither skips nor repeats a sample.

Each step every rank draws the same global batch of sample indices (``next_global_batch``);
data-parallel rank ``r`` takes its micro-batches as contiguous slices of it
(``micro_batch_indices``, ``core.reshard_plan.micro_batch_slice``): every rank of one data-parallel
group (the tensor-parallel peers) takes the same samples.
"""

from __future__ import annotations

from typing import Any

import torch

from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.reshard_plan import micro_batch_slice


class GlobalSampler:
    """Shuffled order over the ``n_samples`` samples of an epoch, consumed a global batch at a time.

    The state is (epoch, position): how many samples of this epoch's permutation the whole job
    has consumed. It does not depend on the world size, so a resume at another world size maps
    onto it without skipping or repeating a sample. An epoch's incomplete tail is dropped.
    """

    def __init__(self, n_samples: int, seed: int) -> None:
        self.n_samples, self.seed = n_samples, seed
        self.epoch, self.position = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> torch.Tensor:
        return torch.randperm(self.n_samples, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))

    def next_global_batch(self, size: int) -> torch.Tensor:
        """The next ``size`` sample indices (the whole job's batch: ``manager.batch.global_batch``)."""
        if self.position + size > self.n_samples:  # drop the incomplete tail, next epoch
            self.epoch, self.position = self.epoch + 1, 0
            self._perm = self._permutation()
        batch = self._perm[self.position : self.position + size]
        self.position += size
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: epoch and samples drawn in it (the same on every rank, independent
        of the world size)."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict()``'s position (of any world size): the epoch's permutation is
        rebuilt from the seed."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation()


def micro_batch_indices(global_batch: torch.Tensor, batch: BatchConfig, dp_rank: int, micro: int) -> torch.Tensor:
    """The samples data-parallel rank ``dp_rank`` uses in accumulation step ``micro`` of this
    step (``0 <= micro < batch.grad_accum``): a contiguous slice of ``micro_batch`` indices."""
    start, end = micro_batch_slice(batch, dp_rank, micro)
    return global_batch[start:end]
