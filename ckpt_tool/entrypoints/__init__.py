"""Torchrun entry points of the offline ``ckpt`` commands, and how they report back.

Each runs under ``torchrun`` as ``python -m MODULE RESULT.json ARGS``; rank 0 writes the result
as JSON, or the ``CkptError`` that stopped it with its message, hint and exit code, so the
command that started it reports the same error with the same code (never a scraped stderr).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ckpt_tool.errors import CkptError, ExitCode, raised_at
from ckpt_tool.store.durable import atomic_write

# How to see a rank's traceback: the command's own process, one rank (the ranks' output is theirs).
ONE_PROCESS_HINT = "with --nproc 1 it runs in this process, where --debug shows the traceback"


def run_and_report(result_path: Path, body: Callable[[], dict[str, Any]]) -> int:
    """Run ``body`` on every rank (torch.distributed is initialised); rank 0 writes its result or
    error to ``result_path``. Returns the process exit code (the error's, or 0)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        result, code = body(), 0
    except CkptError as exc:
        result, code = {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}, exc.exit_code
    except Exception as exc:  # noqa: BLE001 - a bug or the user's model code: reported with where it happened
        traceback.print_exc()  # for --debug readers of the ranks' output
        where = f" at {raised_at(exc)}" if raised_at(exc) else ""
        result = {
            "error": f"rank {rank} failed: {type(exc).__name__}: {exc}{where}",
            "hint": ONE_PROCESS_HINT,
            "exit_code": ExitCode.FAILED,
        }
        code = ExitCode.FAILED
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        atomic_write(result_path, (json.dumps(result, default=str) + "\n").encode())
    return code
