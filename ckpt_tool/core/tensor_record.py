"""What a ``torch.save`` record of one plain tensor holds, read from its pickle without running it. Pure.

DCP writes every tensor item as a ``torch.save`` zip: ``data.pkl`` (a pickle that rebuilds the
tensor from storage ``0``), ``byteorder``, and ``data/0`` (the storage's raw bytes, stored
uncompressed). For a plain CPU tensor the pickle is one call,
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)``, with
the storage a persistent id ``("storage", torch.FloatStorage, "0", "cpu", numel)``. Reading that
with an unpickler that knows only these names gives the layout of the raw bytes, so a reader can
copy them straight into the destination tensor instead of ``torch.load``-ing each item. Anything
else (another rebuild function, a storage type not listed, extra objects) gives ``None``: the
caller falls back to ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass
from typing import Any

MAX_PICKLE_BYTES = 64 << 10

# storage class -> (dtype name in torch, bytes per element)
STORAGE_DTYPES: dict[str, tuple[str, int]] = {
    "FloatStorage": ("float32", 4),
    "DoubleStorage": ("float64", 8),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
}


@dataclass(frozen=True)
class TensorRecord:
    """What the pickle of one saved tensor says: its dtype (torch's name) and item size in bytes, how many
    items its storage holds, and the offset, size and stride (in items) of the tensor in it."""

    dtype: str  # torch dtype name, e.g. "float32"
    itemsize: int
    storage_numel: int
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def numel(self) -> int:
        """The number of items in the tensor (the product of ``size``; 1 for a scalar)."""
        return math.prod(self.size)

    @property
    def row_major(self) -> bool:
        """The tensor is its whole storage, in C order: its bytes are the storage's, in order."""
        expected, step = [], 1
        for n in reversed(self.size):
            expected.append(step)
            step *= n
        strides_ok = all(s == e for s, e, n in zip(self.stride, reversed(expected), self.size, strict=True) if n > 1)
        return self.storage_offset == 0 and self.numel == self.storage_numel and strides_ok

    @property
    def nbytes(self) -> int:
        """The size in bytes of the whole storage (what ``data/0`` must hold), not of the tensor's view of it."""
        return self.storage_numel * self.itemsize


class _Storage:
    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> tuple[Any, ...]:
    return ("tensor", storage, offset, size, stride)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and name in STORAGE_DTYPES:
            return _Storage(name)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return ("persistent", pid)


def _ints(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return value


def parse_tensor_pickle(data: bytes) -> TensorRecord | None:
    """The layout ``data`` (a ``data.pkl``) describes, or None when it is not one plain tensor."""
    if len(data) > MAX_PICKLE_BYTES:
        return None
    try:
        obj = _Unpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - anything unusual: the caller takes torch's own path
        return None
    if not (isinstance(obj, tuple) and len(obj) == 5 and obj[0] == "tensor"):
        return None
    _, storage, offset, size, stride = obj
    if not (isinstance(storage, tuple) and storage[0] == "persistent" and isinstance(storage[1], tuple) and len(storage[1]) == 5):
        return None
    kind, storage_type, key, location, numel = storage[1]
    size_t, stride_t = _ints(size), _ints(stride)
    if (
        kind != "storage"
        or not isinstance(storage_type, _Storage)
        or key != "0"
        or location != "cpu"
        or not isinstance(numel, int)
        or numel < 0
        or not isinstance(offset, int)
        or offset < 0
        or size_t is None
        or stride_t is None
        or len(size_t) != len(stride_t)
    ):
        return None
    dtype, itemsize = STORAGE_DTYPES[storage_type.name]
    record = TensorRecord(dtype, itemsize, numel, offset, size_t, stride_t)
    if record.numel and offset + sum((n - 1) * s for n, s in zip(size_t, stride_t, strict=True)) >= numel:
        return None  # the view reaches past its storage: not a record torch would write
    return record
