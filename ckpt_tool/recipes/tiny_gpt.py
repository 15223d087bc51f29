"""Reference recipe: a small GPT trained on CPU with FSDP2, used by the demo, the tests and the benchmarks.

    torchrun --standalone --nproc-per-node 2 -m ckpt_tool.recipes.tiny_gpt \\
        --ckpt-dir DIR --steps 40 --save-every 10 --metrics metrics.jsonl

Embeddings, causal attention with dropout, MLP, layer norm; AdamW, linear warm-up + cosine LR,
gradient clipping, gradient accumulation; a shuffled, rank-partitioned stream over a
deterministic corpus generated from a seed. One JSON line per optimizer step goes to
``--metrics`` (loss with full float precision), appended across restarts; the run resumes
from the newest valid checkpoint in ``--ckpt-dir``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ckpt_tool.core.batch import BatchConfig, BatchRequest
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import RESTART_CANNOT_HELP, CkptError, ExitCode
from ckpt_tool.supervise.health import node_name
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.distributed import init_distributed
from ckpt_tool.training.heartbeat import heartbeat
from ckpt_tool.training.manager import CheckpointManager
from ckpt_tool.training.probe import ProbeSpec

ENTRY_POINT = "ckpt_tool.recipes.tiny_gpt:build_for_verify"
CRASH_MARKER = ".tiny_gpt_crashed_at_{step}"
NODE_FAULTS = ".tiny_gpt_node_faults"  # one line per injected node fault (--fail-on-node)


# ----------------------------------------------------------------------------- model
@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    seq_len: int = 64
    d_model: int = 192
    n_layer: int = 4
    n_head: int = 4
    dropout: float = 0.1


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.n_head = c.n_head
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.attn_drop = nn.Dropout(c.dropout)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model), nn.Dropout(c.dropout))
        self.register_buffer("mask", torch.tril(torch.ones(c.seq_len, c.seq_len, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_head)
        att = self.attn_drop(att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1))
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1])))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["inputs"])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))


# ----------------------------------------------------------------------------- data
def make_corpus(n_tokens: int, vocab: int, seed: int) -> torch.Tensor:
    """A deterministic token stream with learnable structure: a sparse random Markov chain."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)  # each token has 4 likely successors
    choice = torch.randint(0, 4, (n_tokens,), generator=g)
    noise = torch.rand(n_tokens, generator=g) < 0.1
    rand_tok = torch.randint(0, vocab, (n_tokens,), generator=g)
    out = torch.empty(n_tokens, dtype=torch.long)
    tok = 0
    for i in range(n_tokens):  # ~0.2 s for 200k tokens
        tok = int(rand_tok[i]) if noise[i] else int(succ[tok, choice[i]])
        out[i] = tok
    return out


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


def micro_batch_indices(global_batch: torch.Tensor, batch: BatchConfig, rank: int, micro: int) -> torch.Tensor:
    """The samples rank ``rank`` uses in accumulation step ``micro``: a contiguous slice."""
    start = (micro * batch.dp_size + rank) * batch.micro_batch
    return global_batch[start : start + batch.micro_batch]


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


# ----------------------------------------------------------------------------- building blocks
def lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def build_model(c: GPTConfig, seed: int) -> nn.Module:
    """The same initial weights on every rank, then sharded with FSDP2 when distributed."""
    torch.manual_seed(seed)
    model = TinyGPT(c)
    if dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model


def probe_batch(corpus: Corpus, size: int = 4) -> dict[str, torch.Tensor]:
    return corpus.batch(torch.arange(size))


def build_for_verify(world_size: int = 1, **config: Any) -> tuple[nn.Module, Any]:
    """Entry point for ``ckpt verify``: the model (any weights: they are loaded) and the probe loss.

    ``config`` is what the run recorded in the manifest (``entry_kwargs``); sharded with FSDP2
    when torch.distributed is initialised (``ckpt verify --nproc N``).
    """
    return build_model(GPTConfig(**config), seed=0), lm_loss


def crash_now(ckpt_dir: Path, step: int, repeat: bool = False) -> None:
    """Die like a power cut (SIGKILL), once (a marker file records it) unless ``repeat``."""
    marker = ckpt_dir / CRASH_MARKER.format(step=step)
    if marker.exists() and not repeat:
        return
    marker.write_text(f"crashed at step {step}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def next_faulty_node(args: argparse.Namespace) -> str | None:
    """``--fail-on-node A,B,...``: the node whose ranks fail in this attempt. One name: a lasting
    fault of that node, at every start; several: a fault that moves, once on each, in order."""
    names = [n for n in (args.fail_on_node or "").split(",") if n]
    if not names:
        return None
    try:
        done = len((args.ckpt_dir / NODE_FAULTS).read_text().splitlines())
    except FileNotFoundError:
        done = 0
    if len(names) == 1:
        return names[0]
    return names[done] if done < len(names) else None


def node_fault(ckpt_dir: Path, node: str) -> None:
    """Every rank on ``node`` fails as a GPU with a lasting hardware fault would (once a start)."""
    if node_name() != node:
        return
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(ckpt_dir / NODE_FAULTS, "a") as f:
            f.write(f"{node} {time.time()}\n")
    raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered (injected lasting fault of node {node}, --fail-on-node)")


def stall_once(ckpt_dir: Path, step: int, seconds: float) -> None:
    """Test hook: a data loader that stalls (e.g. a slow shared filesystem), once."""
    marker = ckpt_dir / f".tiny_gpt_stalled_at_{step}"
    if not marker.exists():
        marker.write_text(f"stalled at step {step}\n")
        time.sleep(seconds)


# ----------------------------------------------------------------------------- main
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad arguments are a configuration error: tell `ckpt run` (no restart), then exit 2."""
        heartbeat().fatal(ExitCode.USAGE, f"{self.prog}: {message}")
        super().error(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m ckpt_tool.recipes.tiny_gpt", description=__doc__.split("\n\n")[0])
    exported = os.environ.get("CKPT_DIR")  # set by `ckpt run --ckpt-dir` and `ckpt submit`
    p.add_argument("--ckpt-dir", type=Path, required=not exported, default=Path(exported) if exported else None, help="default: $CKPT_DIR")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--metrics", type=Path, required=True)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--global-batch", type=int)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument(
        "--crash-at-step",
        type=int,
        action="append",
        default=[],
        help="rank 0 dies with SIGKILL at the start of this step, once (repeatable)",
    )
    p.add_argument("--crash-repeat", action="store_true", help="test hook: crash at --crash-at-step on every attempt (a crash loop)")
    p.add_argument(
        "--fail-on-node",
        help="fault injection: the ranks on this SLURM node fail --fail-after-steps steps into every start (a lasting fault); "
        "A,B,C: one fault on each, in order (a fault that moves)",
    )
    p.add_argument("--fail-after-steps", type=int, default=2, help="with --fail-on-node: steps into each start before the fault")
    p.add_argument("--bug-at-step", type=int, help="fault injection: every rank raises at this step, every time (a bug in the code)")
    p.add_argument("--data-stall-at-step", type=int, help="test hook: the data loader stalls at this step, once")
    p.add_argument("--data-stall-s", type=float, default=20.0)
    p.add_argument("--log-samples", type=Path, help="test hook: each rank appends the sample indices of every step to PATH.rankR.jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--d-model", type=int, default=GPTConfig.d_model)
    p.add_argument("--n-layer", type=int, default=GPTConfig.n_layer)
    p.add_argument("--seq-len", type=int, default=GPTConfig.seq_len)
    p.add_argument("--corpus-tokens", type=int, default=200_000)
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--keep-every", type=int)
    p.add_argument("--save-delay", type=float, default=0.0, help="test hook: seconds of extra delay between writing and committing a save")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    init_distributed("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        return train(args, rank, world)
    except CkptError as exc:  # keep its exit code: 2 and 4 are not restarted by `ckpt run`
        print(f"rank {rank}: error: {exc.message}\n  hint: {exc.hint}", file=sys.stderr)
        if exc.exit_code in RESTART_CANNOT_HELP:
            heartbeat().fatal(exc.exit_code, str(exc))
        return exc.exit_code
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, world: int) -> int:
    c = GPTConfig(seq_len=args.seq_len, d_model=args.d_model, n_layer=args.n_layer, dropout=args.dropout)
    # On a resume the checkpoint's global batch wins (the same command runs on any allowed size);
    # --global-batch given explicitly and different changes it on purpose.
    requested = BatchRequest(args.micro_batch, args.grad_accum, args.global_batch)
    corpus = Corpus(c, args.corpus_tokens, seed=1234)
    model = build_model(c, args.seed)
    # Each rank has its own RNG stream for dropout: restored from the checkpoint on resume.
    torch.manual_seed(args.seed * 7919 + 17 * rank + 1)
    random.seed(args.seed + rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.warmup, args.steps))
    sampler = GlobalSampler(corpus.n_samples, args.seed)
    manager = CheckpointManager(
        CheckpointConfig(
            args.ckpt_dir,
            save_every=args.save_every,
            async_save=args.async_save,
            retention=RetentionPolicy(args.keep_last, args.keep_every),
            entry_point=ENTRY_POINT,
            entry_kwargs={"seq_len": c.seq_len, "d_model": c.d_model, "n_layer": c.n_layer, "n_head": c.n_head, "vocab": c.vocab},
        ),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=sampler,
        probe=ProbeSpec(probe_batch(corpus), lm_loss),
        batch=requested,
        before_commit=(lambda step: time.sleep(args.save_delay)) if args.save_delay else None,
    )
    start = manager.resume() or 0
    batch = manager.batch  # after a resume at another world size: the reshard plan (same global batch)
    if batch is None:
        raise CkptError("no batch configuration", "pass --global-batch or --micro-batch")
    fault_node = next_faulty_node(args)  # decided before any rank can fail in this attempt
    samples_log = open(f"{args.log_samples}.rank{rank}.jsonl", "a") if args.log_samples else None
    hb = heartbeat()
    counters = {"samples": 0, "tokens": 0, **manager.extra}
    metrics = open(args.metrics, "a", encoding="utf-8") if rank == 0 else None
    try:
        for step in range(start + 1, args.steps + 1):
            if rank == 0 and step in args.crash_at_step:
                crash_now(args.ckpt_dir, step, args.crash_repeat)
            if step == args.bug_at_step:
                raise ValueError(f"injected bug at step {step} (--bug-at-step): every rank fails here, on every node")
            if fault_node is not None and step == start + args.fail_after_steps:
                node_fault(args.ckpt_dir, fault_node)
            with hb.phase("data"):
                if step == args.data_stall_at_step and rank == 0:  # one rank's loader stalls
                    stall_once(args.ckpt_dir, step, args.data_stall_s)
                global_batch = sampler.next_global_batch(batch.global_batch)
                indices = [micro_batch_indices(global_batch, batch, rank, m) for m in range(batch.grad_accum)]
                micro_batches = [corpus.batch(i) for i in indices]
            if samples_log is not None:  # test hook: which samples each rank used at each step
                samples_log.write(
                    json.dumps({"step": step, "rank": rank, "resumed_from": start, "indices": torch.cat(indices).tolist()}) + "\n"
                )
                samples_log.flush()
            loss_sum = torch.zeros(())
            for data in micro_batches:
                loss = lm_loss(model, data) / batch.grad_accum
                loss.backward()
                loss_sum += loss.detach()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            dist.all_reduce(loss_sum)
            counters["samples"] += batch.global_batch
            counters["tokens"] += batch.global_batch * c.seq_len
            if metrics is not None:
                # json writes floats with repr: full precision, exact round-trip
                line = {"step": step, "loss": float(loss_sum) / world, "lr": float(lr), "grad_norm": float(grad_norm)}
                metrics.write(json.dumps(line) + "\n")
                metrics.flush()
            manager.maybe_save(step, extra=counters)
        manager.close()
    finally:
        if metrics is not None:
            metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
