"""Per-rank state as JSON: no pickle, small tensors (RNG states) inline as base64.

Scheduler, sampler/dataloader position, counters, RNG states and user extras are small and
non-tensor; they go into ``rank_R.state.json`` instead of DCP's pickled byte entries, so loading
them can never run code. Tuples come back as lists (every state_dict this tool restores accepts
that); large tensors belong in the DCP part of the checkpoint.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import torch

from ckpt_tool.errors import CkptError, DamageError

MAX_INLINE_TENSOR_BYTES = 16 << 20
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.bool,
    )
}
_TAG = "__tensor__"
_FLOAT_TAG = "__float__"


def _encode(obj: Any, where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_FLOAT_TAG: repr(obj)}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES or t.numel() * t.element_size() > MAX_INLINE_TENSOR_BYTES:
            raise CkptError(
                f"state entry {where} is a {t.dtype} tensor of {t.numel()} elements: too large or unsupported for JSON state",
                "register large tensors in the model or optimizer state instead",
            )
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {_TAG: {"dtype": name, "shape": list(t.shape), "data": base64.b64encode(raw).decode()}}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise CkptError(f"state entry {where} has a key of type {type(k).__name__}", "use str or int keys in checkpointed state")
            out[("i:" if isinstance(k, int) else "s:") + str(k)] = _encode(v, f"{where}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        return _encode(obj.tolist(), where)
    raise CkptError(
        f"state entry {where} has type {type(obj).__name__}, which a checkpoint cannot hold safely",
        "keep checkpointed state to numbers, strings, lists, dicts and tensors",
    )


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {_TAG}:
            spec = obj[_TAG]
            dtype = _DTYPES[spec["dtype"]]
            raw = base64.b64decode(spec["data"], validate=True)
            shape = [int(s) for s in spec["shape"]]
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            return t.view(dtype).reshape(shape).clone()
        if set(obj) == {_FLOAT_TAG}:
            return float(obj[_FLOAT_TAG])
        out = {}
        for k, v in obj.items():
            out[int(k[2:]) if k.startswith("i:") else k[2:]] = _decode(v)
        return out
    return obj


def dumps(state: dict[str, Any]) -> bytes:
    """``state`` as compact JSON bytes: small tensors inline as base64, numpy values as lists, tuples as
    lists, non-finite floats tagged. Raises ``CkptError`` for what a checkpoint cannot hold safely: an
    object of another type, a key neither str nor int, a tensor too large or of an unsupported dtype."""
    return json.dumps(_encode(state, "state"), separators=(",", ":")).encode()


def loads(raw: bytes, where: str) -> dict[str, Any]:
    """The state ``dumps`` wrote; ``where`` names the file in messages. Raises ``CkptError`` when it is not
    valid JSON, not an object, or an encoded value is damaged. Never unpickles."""
    try:
        state = _decode(json.loads(raw))
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise DamageError(
            f"{where} is not valid checkpoint state ({type(exc).__name__}: {exc})", "run `ckpt validate` and `ckpt rollback`"
        ) from None
    if not isinstance(state, dict):
        raise DamageError(f"{where} is not valid checkpoint state (not an object)", "run `ckpt validate` and `ckpt rollback`")
    return state
