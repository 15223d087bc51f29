"""A rank's own part of a state dict: each DTensor replaced by its local shard (the same
storage), what DCP then loaded put back, and the bytes it holds. The fast tier saves and loads
these single-process state dicts (``training.local_tier``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def local_views(tree: Any) -> Any:
    """The state dict with each DTensor replaced by its local shard (the same storage)."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return {k: local_views(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [local_views(v) for v in tree]
    return tree


def write_back(live: Any, loaded: Any) -> Any:
    """Put what DCP loaded into ``local_views(live)`` back into ``live``: tensors were filled in
    place; values DCP replaced (numbers, a tensor it could not fill) are set or copied in."""
    if isinstance(live, dict):
        for k in live:
            live[k] = write_back(live[k], loaded[k])
        return live
    if isinstance(live, list):
        return [write_back(a, b) for a, b in zip(live, loaded, strict=True)]
    if isinstance(live, torch.Tensor):
        target = live.to_local() if isinstance(live, DTensor) else live
        if loaded is not target:
            target.copy_(loaded)
        return live
    return loaded


def tensor_bytes(tree: Any) -> int:
    """The bytes of the tensors in a nested dict/list state (``numel x element_size``; apply it to
    ``local_views``' result for a rank's own share); other values count 0."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(tensor_bytes(v) for v in tree)
    return 0
