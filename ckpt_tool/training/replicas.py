"""Which of a model's parameters are held by several ranks (replicas that must stay bit-identical),
and a cheap fingerprint of each rank's copy, for the replica check (``CheckpointManager``:
before every save, and every ``CheckpointConfig.replica_check_every`` steps); and the
fingerprints of a rank's own state each step for an audit (``StateFingerprints``).

A replica is a copy another rank holds of the same bytes:

- a plain tensor parameter of a model trained on several ranks (DDP, or a module replicated by
  hand): every rank of the world holds it;
- a DTensor parameter with ``Replicate()`` on a mesh dimension (HSDP's ``dp_replicate``, the
  norms and embeddings tensor parallel leaves whole): the ranks that differ only along those
  dimensions hold the same shard.

A ``Shard`` (FSDP) has no replica: there is nothing to compare it with. The fingerprint is the
xxh3 of the tensor's bytes on the CPU, an integer sum of its bits taken on its device elsewhere
(one host transfer for the whole model): a flipped bit, a changed ulp, a NaN all change it.
``core.anomaly.compare_replicas`` judges the fingerprints of every rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import xxhash
from torch import nn

from ckpt_tool.core.anomaly import FINGERPRINT, Anomaly, compare_replicas
from ckpt_tool.training.comm import Comm

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Replicated:
    """A parameter with replicas: ``name``, this rank's piece of it, and ``key``: ranks whose
    pieces of ``name`` share a key hold the same bytes (the rank's coordinates on the mesh
    dimensions the parameter is not replicated over)."""

    name: str
    tensor: torch.Tensor
    key: tuple[int, ...]


def replicated_parameters(model: nn.Module, world_size: int) -> list[Replicated]:
    """The parameters of ``model`` that another rank holds a copy of (see the module), in the
    model's order; empty on one rank or under plain FSDP."""
    if world_size <= 1:
        return []
    out = []
    for name, p in model.named_parameters():
        placements = getattr(p, "placements", None)
        if placements is None:  # a plain tensor on several ranks: DDP's contract, the whole world
            out.append(Replicated(name, p, ()))
            continue
        mesh = p.device_mesh  # type: ignore[attr-defined]
        coordinate = mesh.get_coordinate()
        if coordinate is None:  # this rank is not on the parameter's mesh
            continue
        replicated = [d for d, pl in enumerate(placements) if pl.is_replicate() and mesh.size(d) > 1]
        if replicated:
            key = tuple(c for d, c in enumerate(coordinate) if d not in replicated)
            out.append(Replicated(name, p.to_local(), key))  # type: ignore[attr-defined]
    return out


def fingerprints(tensors: Iterable[torch.Tensor]) -> list[int]:
    """Each tensor's fingerprint: on the CPU the xxh3 of its bytes (read in place, ~10 GB/s); on
    another device its bits summed as integers into an int64 on the device (no copy to the host
    but one transfer of the sums). Comparable between ranks and runs on the same kind of device."""
    out: list[int | None] = []
    sums: list[torch.Tensor] = []
    for t in tensors:
        flat = t.detach().contiguous().reshape(-1)
        if flat.device.type == "cpu":
            out.append(xxhash.xxh3_64_intdigest(flat.view(torch.uint8).numpy()) if flat.numel() else 0)
        else:
            out.append(None)
            sums.append(
                flat.view(_INT_OF_SIZE[flat.element_size()]).sum(dtype=torch.int64)
                if flat.numel()
                else flat.new_zeros((), dtype=torch.int64)
            )
    on_device = iter(torch.stack(sums).tolist()) if sums else iter(())
    return [v if v is not None else next(on_device) for v in out]


class ReplicaCheck:
    """The replica check of one rank: due before every save and every ``every`` steps (None: at
    saves only; 0: never); ``fingerprint`` takes this rank's fingerprints then, ``compare``
    gathers every rank's over ``comm`` and returns the findings (``core.anomaly.compare_replicas``),
    the same list on every rank."""

    def __init__(self, model: nn.Module, world_size: int, every: int | None) -> None:
        self.params = replicated_parameters(model, world_size) if every != 0 else []
        self.every = every

    def fingerprint(self, step: int, saving: bool) -> list[int] | None:
        """This rank's fingerprints when the step compares the replicas (before a save, every
        ``every`` steps: the same answer on every rank), else None. No collective."""
        if not self.params or not (saving or (self.every and step % self.every == 0)):
            return None
        return fingerprints(p.tensor for p in self.params)

    def compare(self, step: int, mine: list[int], comm: Comm) -> list[Anomaly]:
        """Compare every rank's fingerprints (collective: every rank that fingerprinted the step)."""
        everyone = comm.main_gather(([p.key for p in self.params], mine))  # an async save may hold the manager's group
        return compare_replicas(step, [p.name for p in self.params], [k for k, _ in everyone], [f for _, f in everyone])


def digest(prints: list[int]) -> float:
    """One value for the metrics record from a rank's fingerprints: 52 bits of their xxh3, exact as
    a float (so JSON keeps it bit for bit)."""
    return float(xxhash.xxh3_64_intdigest(",".join(map(str, prints)).encode()) >> 12)


def own_pieces(tensors: Iterable[torch.Tensor | None]) -> list[torch.Tensor]:
    """This rank's pieces of ``tensors`` (a DTensor's local shard, a plain tensor whole; None skipped)."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]


class StateFingerprints:
    """A rank's gradients (taken by an optimizer pre-step hook: they exist then) and parameters
    (after the step), each step, as two values of its record (``fingerprint:grads``,
    ``fingerprint:params``). A replay compares them like any value: the first step whose bits
    differ, on the rank whose own shard changed, even when the change is too small for any loss
    to show before it has crossed a collective. For ``audit_every``: two passes over a rank's
    shards a step (``bench/wrong_numbers.py`` measures them)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self._grads: float | None = None
        optimizer.register_step_pre_hook(lambda *_: self._take_grads())

    def _take_grads(self) -> None:
        self._grads = digest(fingerprints(own_pieces(p.grad for p in self.model.parameters())))

    def values(self) -> dict[str, float]:
        """This step's fingerprints (the gradients' only when the optimizer stepped since the last call)."""
        out = {f"{FINGERPRINT}params": digest(fingerprints(own_pieces(self.model.parameters())))}
        if self._grads is not None:
            out[f"{FINGERPRINT}grads"], self._grads = self._grads, None
        return out
