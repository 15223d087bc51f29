"""What ``ckpt export`` writes, and in which pieces. Pure: the checkpoint's tensor table in, names,
batches and file headers out.

A checkpoint's DCP keys are the manager's: ``model.<fqn>`` for the model (its ``state_dict()``
names: DCP's state-dict API already strips DDP's ``module.`` and torch.compile's ``_orig_mod.``),
``optim.state.<fqn>.<name>`` for optimizer tensors. The export names model tensors as the model
names them (``<fqn>``), so ``model.load_state_dict(load_file(out))`` works; optimizer tensors keep
their key. Nothing else is exported: non-tensor entries (optimizer hyper-parameters) and the probe
batch (``probe.*``, what ``ckpt verify`` measures) are no weights.

Tensors are read a batch at a time: each batch holds at most ``budget`` bytes (the largest
tensor, at least), so the export's memory is bounded by the largest tensor, not the model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

MODEL_PREFIX = "model."
OPTIMIZER_PREFIX = "optim."

# torch dtype name -> safetensors dtype (https://huggingface.co/docs/safetensors: the format's table)
SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a checkpoint as its DCP metadata describes it (the whole tensor, not a shard);
    ``itemsize`` in bytes."""

    key: str  # the DCP key in the checkpoint
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    itemsize: int

    @property
    def nbytes(self) -> int:
        """The tensor's size in bytes: ``itemsize`` times every dimension."""
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ExportEntry:
    """A tensor to export, and the name it gets in the exported file."""

    name: str  # the name in the exported file
    tensor: TensorEntry


def export_entries(tensors: Sequence[TensorEntry], model_only: bool) -> list[ExportEntry]:
    """The tensors to export, in the checkpoint's order, with the names a user expects."""
    out = []
    for t in tensors:
        if t.key.startswith(MODEL_PREFIX):
            out.append(ExportEntry(t.key[len(MODEL_PREFIX) :], t))
        elif not model_only and t.key.startswith(OPTIMIZER_PREFIX):
            out.append(ExportEntry(t.key, t))
    names = [e.name for e in out]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:  # a model parameter named like an optimizer key: keep the checkpoint's keys
        return [ExportEntry(e.tensor.key, e.tensor) for e in out]
    return out


def batches(entries: Sequence[ExportEntry], budget: int) -> list[list[ExportEntry]]:
    """Consecutive groups of at most ``max(budget, largest tensor)`` bytes, in order."""
    limit = max([budget, *(e.tensor.nbytes for e in entries)])
    out: list[list[ExportEntry]] = []
    size = 0
    for e in entries:
        if not out or size + e.tensor.nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(e)
        size += e.tensor.nbytes
    return out


def unsupported_dtypes(entries: Sequence[ExportEntry]) -> list[str]:
    """``"name: dtype"`` for each entry safetensors cannot hold, sorted; empty when every dtype is supported."""
    return sorted({f"{e.name}: {e.tensor.dtype}" for e in entries if e.tensor.dtype not in SAFETENSORS_DTYPES})


def safetensors_header(entries: Sequence[ExportEntry], metadata: dict[str, str]) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file whose data holds ``entries``'
    bytes back to back, in order; padded with spaces to 8 bytes as the format recommends."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for e in entries:
        t = e.tensor
        header[e.name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw
