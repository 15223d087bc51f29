"""Every rank's Python stacks, on request and before a hung job is killed.

Rank side (``arm``, at the heartbeat's start under ``ckpt run``): ``faulthandler`` is registered
on ``STACKS_SIGNAL`` (``SIGRTMIN+4``: a real-time signal; torch, NCCL, gloo, torchrun and SLURM
use none of them, SLURM's ``--signal`` and our preemption use USR1/TERM, and glibc keeps the
ones below ``SIGRTMIN`` for itself) to dump all threads into a node-local file. The handler runs
in C, from the signal, so a rank blocked in C (a collective, a read) answers too, and an armed
handler costs nothing until the signal comes.

Watchdog side (``collect``): signal the ranks, wait a bounded time for each file to grow and
settle, read a rank that did not answer (frozen: SIGSTOP, D state) from outside with ``py-spy
dump --nonblocking`` when it is installed (``pip install ckpt-tool[stacks]``), else say it
could not answer and why (its process state). Each rank's stacks go to
``RUN_DIR/hangs/<id>/rank_R.txt`` after a header of facts (``core.hang_report.header_line``) and
the source lines of the user's frames.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from ckpt_tool.core.hang_report import header_line, parse_stacks, training_thread, where_frame

STACKS_SIGNAL = signal.SIGRTMIN + 4
ENV_STACKS = "CKPT_STACKS_DIR"  # the node-local directory the ranks' handlers write into
ANSWER_WITHIN_S = 2.0  # a rank's own answer (faulthandler) takes milliseconds; past this it cannot answer
SETTLED_S = 0.05  # a dump is complete once its file has not grown for this long
PY_SPY_TIMEOUT_S = 5.0

_armed: IO[str] | None = None  # the open file the rank's handler writes into (kept for the process's life)


def arm(rank: int) -> Path | None:
    """In a rank under ``ckpt run`` (``CKPT_STACKS_DIR`` set): dump every thread's stack into
    ``CKPT_STACKS_DIR/rank{rank}-{pid}.txt`` on ``STACKS_SIGNAL``. Returns the file, or None
    outside ``ckpt run`` or when it cannot be armed (never raises: the training goes on)."""
    global _armed
    directory = os.environ.get(ENV_STACKS)
    if not directory:
        return None
    path = stack_file(Path(directory), rank, os.getpid())
    try:
        if _armed is not None:
            _armed.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        _armed = open(path, "a", encoding="utf-8")
        # what faulthandler gives back when it lets go (at exit): ignore, never the default (terminate)
        signal.signal(STACKS_SIGNAL, signal.SIG_IGN)
        faulthandler.register(STACKS_SIGNAL, file=_armed, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        return None
    return path


def stack_file(directory: Path, rank: int, pid: int) -> Path:
    """The node-local file a rank's handler writes into."""
    return directory / f"rank{rank}-{pid}.txt"


@dataclass(frozen=True)
class Target:
    """A rank to ask: its rank, pid, and its last beat's step, phase and silence (seconds)."""

    rank: int
    pid: int
    step: int | None = None
    phase: str = "?"
    silent_s: float | None = None


def collect(targets: Iterable[Target], stacks_dir: Path, out_dir: Path, node: str, within_s: float = ANSWER_WITHIN_S) -> list[Path]:
    """Ask every target for its stacks and write ``out_dir/rank_R.txt`` for each, within about
    ``within_s`` (plus ``PY_SPY_TIMEOUT_S`` for ranks read from outside). Returns the files."""
    targets = list(targets)
    t0 = time.monotonic()
    sizes: dict[int, int] = {}
    for t in targets:
        sizes[t.rank] = _size(stack_file(stacks_dir, t.rank, t.pid))
        try:
            os.kill(t.pid, STACKS_SIGNAL)
        except (ProcessLookupError, PermissionError):
            pass
    answers: dict[int, tuple[str, float]] = {}  # rank -> (text, seconds)
    last: dict[int, tuple[int, float]] = {}
    while len(answers) < len(targets) and time.monotonic() - t0 < within_s:
        time.sleep(0.01)
        now = time.monotonic()
        for t in targets:
            if t.rank in answers:
                continue
            path = stack_file(stacks_dir, t.rank, t.pid)
            size = _size(path)
            if size <= sizes[t.rank]:
                continue
            seen, since = last.get(t.rank, (-1, now))
            if size != seen:
                last[t.rank] = (size, now)
            elif now - since >= SETTLED_S:
                answers[t.rank] = (_tail(path, sizes[t.rank]), round(now - t0, 3))
    silent = [t for t in targets if t.rank not in answers]
    outside = _py_spy([t.pid for t in silent])
    files = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in targets:
        state = _state(t.pid)
        if t.rank in answers:
            text, seconds = answers[t.rank]
            how, note = "faulthandler", ""
        elif outside.get(t.pid):
            text, seconds = outside[t.pid], round(time.monotonic() - t0, 3)
            how, note = "py-spy", f"did not answer in {within_s:g} s (state {state}); read with py-spy"
        else:
            text, seconds, how = "", None, ""
            note = f"could not answer in {within_s:g} s (state {state})" + (
                "" if py_spy() else "; pip install ckpt-tool[stacks] to read it with py-spy"
            )
        facts = {"rank": t.rank, "node": node, "pid": t.pid, "step": t.step, "phase": t.phase, "silent_s": _round(t.silent_s),
                 "state": state, "answered": how, "answer_s": seconds, "note": note or None}  # fmt: skip
        path = out_dir / f"rank_{t.rank}.txt"
        body = header_line(facts) + "\n" + _code_lines(text) + (text if text else f"# {note}\n")
        path.write_text(body, encoding="utf-8")
        files.append(path)
    return files


def request(run_dir: Path, expected: int, wait_s: float) -> tuple[Path, list[str]]:
    """``ckpt stacks``: ask every node's watchdog of a live job for its ranks' stacks (they look
    for ``stacks_request.json`` twice a second) and wait up to ``wait_s`` for ``expected`` rank
    files (at least one, then until none came for a second). Returns the directory and the files'
    texts; with no answer at all the empty directory is removed (nothing is left half-written).

    Raises:
        OSError: the run directory cannot be written (read-only, permissions).
    """
    from ckpt_tool.supervise.run_dir import open_hang_dir, read_rank_stacks

    hang_dir, _ = open_hang_dir(run_dir, "*", "ckpt-stacks")
    t0 = time.monotonic()
    texts: list[str] = []
    changed = t0
    while time.monotonic() - t0 < wait_s:
        time.sleep(0.1)
        now_texts = read_rank_stacks(hang_dir)
        if len(now_texts) != len(texts):
            texts, changed = now_texts, time.monotonic()
        if texts and (len(texts) >= max(expected, 1) or time.monotonic() - changed > 1.0 + ANSWER_WITHIN_S):
            break
    texts = read_rank_stacks(hang_dir)
    if not texts:
        shutil.rmtree(hang_dir, ignore_errors=True)
    return hang_dir, texts


def py_spy() -> str | None:
    """The ``py-spy`` program (the ``stacks`` extra), beside this Python or on PATH; None without it."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _py_spy(pids: list[int]) -> dict[int, str]:
    """Each pid's stacks read from outside (``py-spy dump --nonblocking``), in parallel; {} without py-spy."""
    program = py_spy()
    if not program or not pids:
        return {}
    procs = {pid: subprocess.Popen([program, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True) for pid in pids}  # fmt: skip
    out = {}
    for pid, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=PY_SPY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            continue
        if proc.returncode == 0 and parse_stacks(text):
            out[pid] = text
    return out


def _code_lines(text: str) -> str:
    """``# code FILE:LINE SOURCE`` for the frame of the training thread the report names (the user's)."""
    frame = where_frame(training_thread(parse_stacks(text)))
    if frame is None:
        return ""
    source = linecache.getline(frame.file, frame.line).strip()
    return f"# code {frame.file}:{frame.line} {source}\n" if source else ""


def _state(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return "gone"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, offset: int) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        return f.read()


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)
