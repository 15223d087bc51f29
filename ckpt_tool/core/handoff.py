"""When a pre-warmed process may take over a rank, and what it then looks like (pure).

``ckpt run`` keeps one spare interpreter per local rank that has already imported torch and the
checkpoint code (``supervise.warm_rank``). When torchrun starts a rank, the command it runs
(``supervise.handoff``) hands its command line, environment, working directory and standard
streams to a spare, which runs the training script as ``__main__``; a restart then skips the
seconds of a new interpreter importing torch.

A spare imported its modules under the environment ``ckpt run`` gave it, not the rank's. That is
the same process as a cold start only when the two differ in nothing read at import: the
variables torchrun sets per rank are read when the process group starts (long after the
imports), and ``OMP_NUM_THREADS``, which the OpenMP runtime reads when torch loads, is applied
again with ``torch.set_num_threads`` at the takeover. Any other difference (a variable a user
exported for one rank, ``CUDA_VISIBLE_DEVICES`` set per rank by a wrapper) means a cold start.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

# What torchrun's agent sets for each worker (torch/distributed/elastic/agent/server/
# local_elastic_agent.py, _start_workers, and multiprocessing/api.py for the error file).
TORCHRUN_RANK_VARS = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "OMP_NUM_THREADS",  # re-applied with torch.set_num_threads at the takeover
    }
)
TORCHRUN_PREFIXES = ("TORCHELASTIC_",)
# The pool directory's files, ``<pid><suffix>``: a spare ready for a launcher (its listening
# socket), the spare maker still importing, a spare's or rank's exit status, a spare a launcher
# refused (why). Written and read by supervise.spare_maker, warm_rank, handoff and warm_pool.
READY, WARMING, EXIT, REFUSED = ".sock", ".warming", ".exit", ".refused"
# Set by the takeover itself (the rank can tell it started warm); never a conflict.
WARM_MARKER = "CKPT_WARM_START"


def _rank_var(name: str) -> bool:
    return name in TORCHRUN_RANK_VARS or name.startswith(TORCHRUN_PREFIXES) or name == WARM_MARKER


def env_conflicts(spare: Mapping[str, str], rank: Mapping[str, str]) -> list[str]:
    """Names of the variables that differ between the spare's environment and the rank's, other
    than those torchrun sets per rank: empty when the spare may take over the rank."""
    names = set(spare) | set(rank)
    return sorted(n for n in names if not _rank_var(n) and spare.get(n) != rank.get(n))


def threads_to_apply(rank: Mapping[str, str]) -> int | None:
    """The intra-op thread count to set at the takeover: the rank's ``OMP_NUM_THREADS`` when it
    is a positive integer, else None (torch's default stands)."""
    value = rank.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def process_title(python: str, argv: Sequence[str]) -> str:
    """What ``ps`` shows for a rank that started warm: the command torchrun would have run."""
    return shlex.join([python, "-u", *argv])


def script_of(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """``("module", name, args)`` for ``-m name args``, ``("path", script, args)`` otherwise.

    Raises:
        ValueError: on an empty command or ``-m`` without a module name.
    """
    if not argv:
        raise ValueError("no training command")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError("-m without a module name")
        return "module", argv[1], list(argv[2:])
    return "path", argv[0], list(argv[1:])
