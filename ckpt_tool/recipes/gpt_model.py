"""The reference recipe's model: a small GPT, and how it is laid out on a device mesh.

Embeddings, causal attention with dropout, MLP, layer norm. ``shard_model`` applies tensor
parallelism to the attention and MLP of every block (torch's ``parallelize_module``: the query,
key, value and first MLP projections column-wise, the output projections row-wise) on the
mesh's ``tp`` dimension, then FSDP2 (``fully_shard``) over its data-parallel dimension.
Embeddings, layer norms and the output head stay replicated across ``tp`` (sharded by FSDP only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes (vocabulary, context length in tokens, width, layers, heads) and dropout probability;
    ``n_head`` must divide ``d_model``. Recorded in the checkpoint's entry kwargs."""

    vocab: int = 256
    seq_len: int = 64
    d_model: int = 192
    n_layer: int = 4
    n_head: int = 4
    dropout: float = 0.1

    def tp_limits(self) -> dict[str, int]:
        """What a tensor-parallel size must divide (recorded in the mesh: the planner refuses others)."""
        return {"attention heads": self.n_head, "MLP hidden size": 4 * self.d_model}


class Attention(nn.Module):
    """Causal multi-head self-attention with attention dropout; under tensor parallelism each rank holds its
    heads' query, key and value columns."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.head_dim = c.d_model // c.n_head
        self.q, self.k, self.v = (nn.Linear(c.d_model, c.d_model) for _ in range(3))
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.register_buffer("mask", torch.tril(torch.ones(c.seq_len, c.seq_len, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of shape ``(batch, tokens, d_model)`` (tokens <= ``seq_len``) to the same shape, each position
        attending to itself and earlier ones only."""
        b, t, _ = x.shape
        # Under tensor parallelism q, k, v hold this rank's heads only: -1 is the local head count.
        q, k, v = (z(x).view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = self.drop(att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1))
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """The block's feed-forward part: ``d_model -> 4 * d_model -> d_model`` with GELU and dropout."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(c.d_model, 4 * c.d_model)
        self.down = nn.Linear(4 * c.d_model, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of shape ``(..., d_model)`` to the same shape."""
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """One pre-norm transformer block: attention then MLP, each on a residual path."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c.d_model), Attention(c)
        self.ln2, self.mlp = nn.LayerNorm(c.d_model), MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of shape ``(batch, tokens, d_model)`` to the same shape."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """The recipe's model: token and position embeddings, ``n_layer`` blocks, a final layer norm and an
    unbiased output head over the vocabulary."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids ``idx`` of shape ``(batch, tokens)`` (tokens <= ``seq_len``) to logits of shape ``(batch,
        tokens, vocab)``."""
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross entropy of the next token; the batch is moved to the model's device (the probe's is stored on the CPU)."""
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    inputs, targets = batch["inputs"].to(device), batch["targets"].to(device)
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def shard_model(model: TinyGPT, mesh: DeviceMesh) -> TinyGPT:
    """Tensor parallel on ``mesh["tp"]`` (when the mesh has it, size > 1), then FSDP2 on the
    data-parallel dimensions: ``dp_shard``, or HSDP over ``(dp_replicate, dp_shard)`` when the mesh
    has both. The mesh's dimensions are named ``dp_shard`` and (optionally) ``dp_replicate`` and ``tp``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    names = mesh.mesh_dim_names or ()
    if "tp" in names and mesh["tp"].size() > 1:
        plan = {
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(),
        }
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
    if "dp_replicate" in names:
        dp = mesh["dp_replicate", "dp_shard"]  # a 2-D mesh: fully_shard replicates over the first, shards over the second
    else:
        dp = mesh["dp_shard"] if "tp" in names else mesh
    for block in model.blocks:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return model
