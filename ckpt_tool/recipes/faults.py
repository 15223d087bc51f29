"""Fault injection of the reference recipe: power cuts, lasting node faults, bugs, data stalls,
hangs, stragglers.

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

from ckpt_tool.supervise.round_end import node_name

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
