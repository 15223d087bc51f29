"""The one training every framework of the peers benchmark runs (``bench/peers``): the reference
recipe's model (``ckpt_tool/recipes/gpt_model.py``, loaded by its path so that a peer's venv needs
only torch), DDP over gloo on the CPU, AdamW, a deterministic batch per (step, rank), and a line per
step per rank in ``STEPS_DIR/rank_R.jsonl`` (``step``, ``time``, ``pid``, ``loss``; flushed) that the
driver (``run_peers.py``) reads from outside to time failures.

The plain-DCP checkpointing that ``plain_train.py`` and ``nvrx_train.py`` use is here once too:
``torch.distributed.checkpoint`` with ``get_state_dict``/``set_state_dict``, as torch's
documentation recommends, a ``step_N`` directory per save and a ``LATEST`` file written by rank 0
after the save (no hashes, no manifest: what a user starts from).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

GPT_MODEL = Path(__file__).resolve().parents[2] / "ckpt_tool" / "recipes" / "gpt_model.py"
D_MODEL, N_LAYER, SEQ_LEN, VOCAB, MICRO_BATCH, LR = 64, 2, 64, 256, 8, 3e-3
SAVE_EVERY = 10


def _gpt() -> Any:
    """``ckpt_tool/recipes/gpt_model.py`` as a module of its own (it imports only torch)."""
    spec = importlib.util.spec_from_file_location("peers_gpt_model", GPT_MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_gpt_model"] = module
    spec.loader.exec_module(module)
    return module


gpt = _gpt()


def config() -> Any:
    """The model's size: the recipe's test size (``--d-model 64 --n-layer 2``)."""
    return gpt.GPTConfig(vocab=VOCAB, seq_len=SEQ_LEN, d_model=D_MODEL, n_layer=N_LAYER, n_head=4, dropout=0.0)


def build() -> torch.nn.Module:
    """The model, the same weights on every rank and framework (seed 0)."""
    torch.manual_seed(0)
    return gpt.TinyGPT(config())


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW at a fixed learning rate."""
    return torch.optim.AdamW(model.parameters(), lr=LR)


def batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s micro-batch of optimizer step ``step`` (1-based): the same on every run."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ_LEN + 1), generator=g)
    return {"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> float:
    """One optimizer step on ``step``'s batch; the loss."""
    opt.zero_grad(set_to_none=True)
    loss = gpt.lm_loss(model, batch(step, rank))
    loss.backward()
    opt.step()
    return float(loss.detach())


class StepLog:
    """``STEPS_DIR/rank_R.jsonl``: a line per trained step, flushed (the driver's clock of progress)."""

    def __init__(self, steps_dir: str | Path, rank: int) -> None:
        Path(steps_dir).mkdir(parents=True, exist_ok=True)
        self._f = open(Path(steps_dir) / f"rank_{rank}.jsonl", "a", encoding="utf-8")

    def step(self, step: int, loss: float) -> None:
        """Record that ``step`` was trained now."""
        self._f.write(json.dumps({"step": step, "time": time.time(), "pid": os.getpid(), "loss": loss}) + "\n")
        self._f.flush()


@dataclass(frozen=True)
class Args:
    """What every adapter takes: where checkpoints and step logs go, how many steps."""

    ckpt_dir: Path
    steps_dir: Path
    steps: int


def parse(argv: list[str]) -> Args:
    """``CKPT_DIR STEPS_DIR STEPS``."""
    return Args(Path(argv[0]), Path(argv[1]), int(argv[2]))


def rank_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


# ----------------------------------------------------------------------------- plain DCP checkpoints


def dcp_resume(model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt_dir: Path) -> int:
    """Load the step ``LATEST`` names (torch DCP, every rank); the step, 0 when none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    latest = ckpt_dir / "LATEST"
    if not latest.exists():
        return 0
    step = int(latest.read_text())
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(ckpt_dir / f"step_{step}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return step


def dcp_training(args: Args, after_step: Any = None) -> None:
    """The plain-DCP training of ``plain_train.py`` and ``nvrx_train.py``: gloo (its default 30-minute
    collective timeout), DDP, resume from ``LATEST``, a DCP save every ``SAVE_EVERY`` steps;
    ``after_step()`` once a step is trained and saved (NVRx's heartbeat)."""
    from datetime import timedelta

    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=timedelta(minutes=30))
    rank, _ = rank_world()
    model = DistributedDataParallel(build())
    opt = optimizer(model)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    start = dcp_resume(model, opt, args.ckpt_dir)
    log = StepLog(args.steps_dir, rank)
    for step in range(start + 1, args.steps + 1):
        loss = train_step(model, opt, step, rank)
        if step % SAVE_EVERY == 0:
            dcp_save(model, opt, args.ckpt_dir, step)
        if after_step is not None:
            after_step()
        log.step(step, loss)
    dist.destroy_process_group()


def dcp_save(model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt_dir: Path, step: int) -> None:
    """Save ``step`` (torch DCP, every rank), then rank 0 points ``LATEST`` at it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(ckpt_dir / f"step_{step}"))
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = ckpt_dir / "LATEST.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, ckpt_dir / "LATEST")
