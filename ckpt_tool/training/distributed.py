"""Starting torch.distributed so that torchrun's in-place restarts work.

torchrun restarts a failed worker group in the same allocation (``--max-restarts``), and the new
workers reuse the agent's TCPStore. In torch 2.13 the keys of the previous attempt are still in
it, so the new ranks read the dead ranks' addresses and gloo fails with "connectFullMesh ...
Connection refused" (measured here; pytorch#167288 reports the NCCL twin). ``init_distributed``
gives every attempt its own key prefix. Across nodes the restart count is not shared (an agent
that restarts its ranks because another node failed does not raise it), so ``ckpt run`` also
sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: a fresh store every rendezvous round, where this
function takes the plain ``env://`` path. Outside torchrun it makes a one-process group, so the
same script runs under ``python`` too.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def default_backend() -> str:
    """The process-group backend: gloo for CPU tensors and NCCL for CUDA ones when CUDA is available, else gloo alone."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(backend: str | None = None, timeout: timedelta | None = None) -> None:
    """Call instead of ``torch.distributed.init_process_group()``.

    Under torchrun, every attempt (``TORCHELASTIC_RESTART_COUNT``) gets its own key prefix in the
    agent's store, so an in-place restart does not read the dead ranks' addresses. Outside
    torchrun it makes a one-process group (``python train.py`` works too).

    Args:
        backend: default ``gloo`` on CPU, ``cpu:gloo,cuda:nccl`` when CUDA is available.
        timeout: passed to ``init_process_group`` (collectives' timeout).

    Raises:
        whatever ``torch.distributed.init_process_group`` raises (e.g. a rendezvous timeout).
    """
    backend = backend or default_backend()
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, **kwargs)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(
            backend, store=dist.PrefixStore(f"ckpt_tool/attempt_{attempt}", store), rank=rank, world_size=world, **kwargs
        )
    else:
        dist.init_process_group(backend, **kwargs)
