"""The reference recipe's data: a deterministic corpus and a sampler whose position is global.

Each step takes one global batch of the epoch's permutation; data-parallel rank ``r`` takes its
micro-batches as contiguous slices of it (``core.reshard.step_slices``), so every rank of one
data-parallel group (the tensor-parallel peers) takes the same samples and a resume on another
mesh neither skips nor repeats a sample.
"""

from __future__ import annotations

from typing import Any

import torch

from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.reshard import micro_batch_slice
from ckpt_tool.recipes.gpt_model import GPTConfig


def make_corpus(n_tokens: int, vocab: int, seed: int) -> torch.Tensor:
    """A deterministic token stream with learnable structure: a sparse random Markov chain."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)  # each token has 4 likely successors
    choice = torch.randint(0, 4, (n_tokens,), generator=g)
    noise = torch.rand(n_tokens, generator=g) < 0.1
    rand_tok = torch.randint(0, vocab, (n_tokens,), generator=g)
    # The chain walked on Python lists: indexing tensors element by element cost ~1 s at every
    # rank start for 60k tokens (measured), the same walk on lists ~20 ms.
    successors, choices, noisy, random_tokens = succ.tolist(), choice.tolist(), noise.tolist(), rand_tok.tolist()
    out = [0] * n_tokens
    tok = 0
    for i in range(n_tokens):
        tok = random_tokens[i] if noisy[i] else successors[tok][choices[i]]
        out[i] = tok
    return torch.tensor(out, dtype=torch.long)


class GlobalSampler:
    """Shuffled order over the samples of an epoch, consumed a global batch at a time.

    The state is (epoch, position): how many samples of this epoch's permutation the whole job
    has consumed. It does not depend on the world size, so a resume at another world size maps
    onto it without skipping or repeating a sample.
    """

    def __init__(self, n_samples: int, seed: int) -> None:
        self.n_samples, self.seed = n_samples, seed
        self.epoch, self.position = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> torch.Tensor:
        return torch.randperm(self.n_samples, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))

    def next_global_batch(self, size: int) -> torch.Tensor:
        if self.position + size > self.n_samples:  # drop the incomplete tail, next epoch
            self.epoch, self.position = self.epoch + 1, 0
            self._perm = self._permutation()
        batch = self._perm[self.position : self.position + size]
        self.position += size
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation()


def micro_batch_indices(global_batch: torch.Tensor, batch: BatchConfig, dp_rank: int, micro: int) -> torch.Tensor:
    """The samples data-parallel rank ``dp_rank`` uses in accumulation step ``micro``: a contiguous slice."""
    start, end = micro_batch_slice(batch, dp_rank, micro)
    return global_batch[start:end]


class Corpus:
    def __init__(self, c: GPTConfig, n_tokens: int, seed: int) -> None:
        self.tokens = make_corpus(n_tokens, c.vocab, seed)
        self.seq_len = c.seq_len
        self.n_samples = (n_tokens - 1) // c.seq_len

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        starts = indices * self.seq_len
        offsets = torch.arange(self.seq_len + 1)
        windows = self.tokens[starts[:, None] + offsets[None, :]]
        return {"inputs": windows[:, :-1].contiguous(), "targets": windows[:, 1:].contiguous()}


def probe_batch(corpus: Corpus, size: int = 4) -> dict[str, torch.Tensor]:
    return corpus.batch(torch.arange(size))
