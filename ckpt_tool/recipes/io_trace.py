"""What a command read from storage, measured from outside its processes: ``strace -f`` records
every read system call with the path of its file descriptor, and the bytes they returned are
summed per file. Used by the tests and the benchmark of the cooperative load (``bench/load_once.py``);
needs ``strace`` (on PATH) and permission to trace the command's own children (the default)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

READ_CALLS = "read,pread64,readv,preadv,preadv2"
_LINE = re.compile(r"^(?:read|pread64|readv|preadv|preadv2)\(\d+<(?P<path>[^>]*)>.*\)\s+=\s+(?P<n>\d+)")


@dataclass(frozen=True)
class TracedRun:
    """The command's exit code and output, and per file under the traced directory: the bytes
    returned by reads of it, and how many processes read it."""

    returncode: int
    output: str
    read: Mapping[str, int]  # path relative to the traced directory -> bytes returned by reads
    readers: Mapping[str, int]  # path relative to the traced directory -> processes that read from it

    def total(self, names: Sequence[str] | None = None) -> int:
        """Bytes read from ``names`` (default: every file)."""
        return sum(n for path, n in self.read.items() if names is None or path in names)


def strace_available() -> bool:
    """Whether ``strace`` is on PATH."""
    return shutil.which("strace") is not None


def traced(cmd: Sequence[str], under: Path, env: Mapping[str, str] | None = None, timeout: float = 600) -> TracedRun:
    """Run ``cmd`` under ``strace -f`` and sum what its processes read from files below ``under``."""
    root = str(Path(under).resolve())
    with tempfile.TemporaryDirectory(prefix="ckpt-strace-") as out:
        proc = subprocess.run(
            ["strace", "-f", "-ff", "-qq", "-y", "-e", f"trace={READ_CALLS}", "-o", f"{out}/t", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
        )
        read: dict[str, int] = {}
        readers: dict[str, int] = {}
        for trace in Path(out).iterdir():  # one file per process (-ff): lines are never split by another's
            seen: set[str] = set()
            for line in trace.read_text(errors="replace").splitlines():
                m = _LINE.match(line)
                if m and m["path"].startswith(root + "/") and int(m["n"]):
                    rel = m["path"][len(root) + 1 :]
                    read[rel] = read.get(rel, 0) + int(m["n"])
                    seen.add(rel)
            for rel in seen:
                readers[rel] = readers.get(rel, 0) + 1
    return TracedRun(proc.returncode, proc.stdout + proc.stderr, read, readers)
