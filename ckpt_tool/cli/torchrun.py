"""The offline operations that run on several ranks (``ckpt verify --nproc``, ``ckpt reshard``):
their entry point of ``ckpt_tool.entrypoints`` under torchrun, its JSON result or its error read back."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ckpt_tool.core.torchrun_output import ranks_error
from ckpt_tool.errors import CkptError, ExitCode


def run_entry(module: str, nproc: int, args: list[str], what: str) -> dict[str, Any]:
    """Run an entry point of ``ckpt_tool.entrypoints`` under torchrun; it writes a JSON result,
    or its error with its exit code, which is raised here with the same message and code."""
    from ckpt_tool.entrypoints import ONE_PROCESS_HINT  # imports torch: not at the top (ckpt list stays fast)

    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            module,
            str(result_path),
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not result_path.exists():
            raise CkptError(
                f"{what} under torchrun failed (exit {proc.returncode}) before it could report: {ranks_error(proc.stderr)}",
                ONE_PROCESS_HINT,
                ExitCode.FAILED,
            )
        result = json.loads(result_path.read_text())
    if "error" in result:
        raise CkptError(result["error"], result.get("hint", ""), int(result.get("exit_code", ExitCode.FAILED)))
    return result
