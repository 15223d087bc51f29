"""The recipes' ``--device cpu|cuda|auto``: which device, and moving a batch there.

``auto`` is CUDA when this process sees a CUDA device, else the CPU. ``cuda`` without one is a
usage error (exit 2) said before anything starts. Each rank takes the CUDA device of its
``LOCAL_RANK``; the collectives then go over NCCL (``init_distributed``'s ``cpu:gloo,cuda:nccl``).
The model is built on the CPU and moved (the same initial weights on either device); the data
and the probe batch stay CPU tensors until a step or the probe moves them (the probe stored in a
checkpoint is device-free: ``ckpt verify`` runs it on the CPU side).
"""

from __future__ import annotations

import argparse
import os

import torch

CHOICES = ("auto", "cpu", "cuda")


def add_device_option(p: argparse.ArgumentParser) -> None:
    """Add ``--device auto|cpu|cuda`` (default ``auto``) to ``p``; ``resolve`` turns it into a device type."""
    p.add_argument("--device", choices=CHOICES, default="auto", help="where the model, data and probe live (auto: CUDA when there is one)")


def pick_device(choice: str, cuda_available: bool) -> tuple[str | None, str | None]:
    """``("cpu"|"cuda", None)``, or ``(None, why not)`` for ``cuda`` on a machine without CUDA."""
    if choice == "cuda" and not cuda_available:
        return None, (
            "--device cuda: this process sees no CUDA device (torch.cuda.is_available() is false"
            f", torch {torch.__version__}); use --device cpu, or --device auto (CUDA when there is one)"
        )
    if choice == "auto":
        return ("cuda" if cuda_available else "cpu"), None
    return choice, None


def resolve(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Replace ``args.device`` by the device type, or ``p.error`` (exit 2) when it cannot be had."""
    device, why = pick_device(args.device, torch.cuda.is_available())
    if why is not None:
        p.error(why)
    args.device = device


def bind(device_type: str) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` made current (before the process group), or the CPU."""
    if device_type != "cuda":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def backend(device_type: str) -> str | None:
    """gloo on the CPU (as before); on CUDA ``init_distributed``'s default (``cpu:gloo,cuda:nccl``)."""
    return "gloo" if device_type != "cuda" else None


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``batch`` with every tensor moved to ``device`` (a new dict; non-blocking copies)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def device_of(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter; the CPU for a model without parameters."""
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")
