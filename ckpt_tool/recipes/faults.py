"""Fault injection of the reference recipes: power cuts, lasting node faults, bugs, data stalls,
hangs, stragglers, and wrong numbers (a corrupted gradient, a poisoned batch, a skewed replica).

Each fault is real where it lands (a SIGKILL, an exception on every rank of a node, a sleeping
data loader); markers in the checkpoint directory make a one-time fault happen once across
restarts.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ckpt_tool.supervise.round_end import node_name
from ckpt_tool.training.replicas import replicated_parameters

CRASH_MARKER = ".tiny_gpt_crashed_at_{step}"
NODE_FAULTS = ".tiny_gpt_node_faults"  # one line per injected node fault (--fail-on-node)


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
    if not names or int(os.environ.get("SLURM_RESTART_COUNT", "0")) < args.fail_from_restart:
        return None  # no fault, or not yet (--fail-from-restart: a node that goes bad later)
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


def hang_once(ckpt_dir: Path, step: int) -> None:
    """A rank that loops forever in Python (busy, not stopped: a bug, a retry loop without end),
    once: the marker makes the restart go through."""
    marker = ckpt_dir / f".tiny_gpt_hung_at_{step}"
    if marker.exists():
        return
    marker.write_text(f"hung at step {step}\n")
    spins = 0  # the watchdog finds it silent, asks for its stacks and kills it
    while True:
        spins += 1


def slow_compute(seconds: float) -> None:
    """A rank whose compute is slower (a throttled GPU, a slow core): ``seconds`` more CPU time
    of work, as more work would take (a sleep would be a rank waiting, not computing)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def before_commit_hook(args: argparse.Namespace, rank: int) -> Callable[[int], None] | None:
    """Test hooks between writing a save's files and committing it (the save thread when async):
    ``--save-delay`` seconds (at every save, or at the ``--save-delay-at`` steps), and
    ``--crash-in-save-at STEP``: rank 0 dies of SIGKILL there, once (a crash mid-save)."""
    delay, delay_at = getattr(args, "save_delay", 0.0), getattr(args, "save_delay_at", [])
    crash_at = getattr(args, "crash_in_save_at", None)
    if not delay and crash_at is None:
        return None

    def hook(step: int) -> None:
        if delay and (not delay_at or step in delay_at):
            time.sleep(delay)
        if rank == 0 and step == crash_at:
            crash_now(args.ckpt_dir, step)

    return hook


def add_wrong_number_options(p: argparse.ArgumentParser) -> None:
    """The wrong-number faults and the anomaly policy, the same in both recipes."""
    p.add_argument(
        "--corrupt-at-step", type=int, help="fault injection: one gradient element of --corrupt-rank goes wrong at this step, once"
    )
    p.add_argument("--corrupt-rank", type=int, default=0, help="with --corrupt-at-step: the rank whose gradient goes wrong")
    p.add_argument(
        "--corrupt-kind",
        choices=("nan", "bitflip", "spike", "small"),
        default="nan",
        help="with --corrupt-at-step: a NaN; the top exponent bit flipped (~1e32: the norm overflows); x 2^16 (a lower exponent bit: a spike); "
        "x 1.001 (small: no check of a value sees it, an audit does)",
    )
    p.add_argument(
        "--poison-at-step", type=int, help="fault injection: the batch of this step makes rank 0's loss NaN, every time (data-borne)"
    )
    p.add_argument(
        "--skew-at-step",
        type=int,
        help="fault injection: one replicated weight of --skew-rank moves by one ulp after this step, once (silent)",
    )
    p.add_argument("--skew-rank", type=int, default=1, help="with --skew-at-step: the rank whose replica is skewed")
    p.add_argument("--anomaly", choices=("replay", "stop", "warn"), default="replay", help="what a wrong number leads to")
    p.add_argument("--anomaly-window", type=int, default=50, help="values per field before spikes are judged (median + k x MAD)")
    p.add_argument("--replica-check-every", type=int, help="compare the replicas every N steps too (default: at every save only; 0: never)")
    p.add_argument(
        "--audit-every", type=int, default=0, help="every N-th save, recompute the steps since the previous checkpoint first (0: never)"
    )


def _once(ckpt_dir: Path, what: str, step: int) -> bool:
    """True the first time ``what`` happens at ``step`` in this checkpoint directory (a marker
    records it): a transient fault does not come back in the replay."""
    marker = ckpt_dir / f".tiny_gpt_{what}_at_{step}"
    if marker.exists():
        return False
    marker.write_text(f"{what} at step {step}\n")
    return True


def corrupt_gradient_once(args: argparse.Namespace, model: nn.Module, rank: int, step: int) -> None:
    """``--corrupt-at-step``: after the backward, the first element of this rank's piece of the
    first gradient becomes NaN, gets its top exponent bit flipped (a huge value: the norm
    overflows), is multiplied by 2^16 (a lower exponent bit: a finite spike) or by 1.001 (small:
    only a recomputation sees it), once: a GPU that
    computed a wrong value in its own shard (the other ranks' values are untouched)."""
    if step != args.corrupt_at_step or rank != args.corrupt_rank or not _once(args.ckpt_dir, "corrupted", step):
        return
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    flat = local.view(-1)
    with torch.no_grad():
        if args.corrupt_kind == "nan":
            flat[0] = float("nan")
        elif args.corrupt_kind == "spike":
            flat[0] *= 2.0**16
        elif args.corrupt_kind == "small":
            flat[0] *= 1.001
        else:
            bits = flat[:1].view(torch.int32)
            bits ^= 1 << 30  # the top bit of a float32's exponent
    print(f"rank {rank}: injected a {args.corrupt_kind} into a gradient at step {step} (--corrupt-at-step)", flush=True)


def poison(args: argparse.Namespace, loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """``--poison-at-step``: rank 0's loss of that step is NaN, every time (a bad sample: the data,
    not the hardware; the replay reproduces it)."""
    if step == args.poison_at_step and rank == 0:
        return loss * float("nan")
    return loss


def skew_replica_once(args: argparse.Namespace, model: nn.Module, rank: int, world: int, step: int) -> None:
    """``--skew-at-step``: after the optimizer step, this rank's copy of the first replicated weight
    moves by one ulp, once: a silent corruption no loss shows at once, that only a comparison of the
    replicas finds. A model without replicas (plain FSDP) is refused by name."""
    if step != args.skew_at_step or rank != args.skew_rank:
        return
    replicated = replicated_parameters(model, world)
    if not replicated:
        raise SystemExit("--skew-at-step needs a replicated parameter (DDP, HSDP or tensor parallel), this model has none")
    if not _once(args.ckpt_dir, "skewed", step):
        return
    with torch.no_grad():
        flat = replicated[0].tensor.view(-1)
        flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=flat.dtype, device=flat.device))
    print(f"rank {rank}: skewed its replica of {replicated[0].name} by one ulp after step {step} (--skew-at-step)", flush=True)
