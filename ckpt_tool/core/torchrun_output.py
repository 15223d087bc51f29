"""What went wrong, read from the output of ranks run under torchrun. Pure: text in, a line out.

torchrun ends a failed run with its own report (``ChildFailedError``, ``error_file``, the
traceback hint); the line a user needs is the ranks' own: an exception (``[rank0]: ValueError:
...``), or a ckpt-tool error as the recipes print it (``rank 0: error: ...``), or, first of all, a
checkpoint found damaged while loading (``ckpt: checkpoint step N is damaged (...)``), or a
script Python cannot open.
"""

from __future__ import annotations

import re

_EXCEPTION = re.compile(r"^(\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$", re.M)
_CKPT_ERROR = re.compile(r"^rank \d+: error: (.*)$", re.M)
_DAMAGE = re.compile(r"^ckpt: (checkpoint step \d+ is damaged .*)$", re.M)
_NO_SCRIPT = re.compile(r"^(?:\[rank\d+\]:\s*)?\S*python[\d.]*: (can't open file .*)$", re.M)  # the script is not there


def ranks_error(output: str) -> str:
    """The ranks' own error line in torchrun's output, not torchrun's ``ChildFailedError`` report
    after it; else the output's last line."""
    for pattern in (_DAMAGE, _NO_SCRIPT, _CKPT_ERROR):
        found = pattern.findall(output)
        if found:
            return found[0].strip()
    errors = [m.group(2) for m in _EXCEPTION.finditer(output) if "ChildFailedError" not in m.group(2)]
    if errors:
        return errors[-1].strip()
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"
