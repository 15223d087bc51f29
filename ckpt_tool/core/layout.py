"""Names on disk: step directories, partial (staging) directories, the pointer and the index.

Pure: no filesystem access. Every place that needs to parse or build a name calls this module,
so the step-parsing rule exists exactly once.

    DIR/
      LATEST                      pointer: the name of the newest committed step directory
      index.jsonl                 append-only event log (commits, validations, quarantines)
      .lock                       filelock guarding commits, pointer moves and deletions
      .owner.json                 the job writing this directory (job id, host, pid, last seen)
      run/                        the run's events (events.jsonl), sbatch scripts and job output
      step_00000040/              a committed checkpoint (manifest written last)
        ckpt_manifest.json
        .metadata  __0_0.distcp  __1_0.distcp ...   (PyTorch DCP)
        rank_00000.state.json ...                    (per-rank JSON state: RNG, data position)
      .step_00000050.partial/     a save in progress (never a checkpoint)
      .step_00000030.deleting/    a retention delete in progress
      quarantine/                 damaged or superseded checkpoints, never deleted automatically
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

LATEST_NAME = "LATEST"
INDEX_NAME = "index.jsonl"
LOCK_NAME = ".lock"
OWNER_NAME = ".owner.json"
QUARANTINE_NAME = "quarantine"
MANIFEST_NAME = "ckpt_manifest.json"
RUN_DIR_NAME = "run"  # CKPT_DIR/run: the run's events, scripts and job output (`ckpt run`, `ckpt submit`)
DCP_METADATA_NAME = ".metadata"
STEP_DIGITS = 8
MAX_STEP = 10**STEP_DIGITS - 1

_STEP_RE = re.compile(rf"^step_(\d{{{STEP_DIGITS}}})$")
_PARTIAL_RE = re.compile(rf"^\.step_(\d{{{STEP_DIGITS}}})\.partial$")
_DELETING_RE = re.compile(rf"^\.step_(\d{{{STEP_DIGITS}}})\.deleting$")
_RANK_STATE_RE = re.compile(r"^rank_(\d{5})\.state\.json$")
_DCP_SHARD_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


class EntryKind(Enum):
    """What a name in a checkpoint directory is: a committed-or-not step directory, a staging (``partial``)
    directory, or one being deleted (``deleting``)."""

    STEP = "step"
    PARTIAL = "partial"
    DELETING = "deleting"


@dataclass(frozen=True)
class DirEntry:
    """A name of ours found in a checkpoint directory (see ``parse_entry``): its kind, its step and the name as found."""

    kind: EntryKind
    step: int
    name: str


def _check_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be an integer in [0, {MAX_STEP}], got {step!r}")
    return step


def step_dir_name(step: int) -> str:
    """``step_NNNNNNNN``: the directory name of ``step``, zero-padded to ``STEP_DIGITS`` so names sort as
    steps. Raises ``ValueError`` for a negative or oversized step."""
    return f"step_{_check_step(step):0{STEP_DIGITS}d}"


def partial_dir_name(step: int) -> str:
    """``.step_NNNNNNNN.partial``: where the ranks stage ``step`` before the commit renames it (hidden, so
    no reader takes it for a checkpoint)."""
    return f".{step_dir_name(step)}.partial"


def deleting_dir_name(step: int) -> str:
    """``.step_NNNNNNNN.deleting``: what a step directory is renamed to before its files are removed, so a
    crash mid-delete never leaves a half step named ``step_N``."""
    return f".{step_dir_name(step)}.deleting"


def rank_state_name(rank: int) -> str:
    """``rank_RRRRR.state.json``: the file holding one rank's non-tensor state (counters, sampler position,
    RNG states) in a step directory."""
    return f"rank_{rank:05d}.state.json"


def parse_entry(name: str) -> DirEntry | None:
    """Classify a name found in a checkpoint directory; None for anything that is not ours."""
    for kind, regex in ((EntryKind.STEP, _STEP_RE), (EntryKind.PARTIAL, _PARTIAL_RE), (EntryKind.DELETING, _DELETING_RE)):
        m = regex.match(name)
        if m:
            return DirEntry(kind, int(m.group(1)), name)
    return None


def parse_step_dir_name(name: str) -> int | None:
    """The step of a step directory's name (``step_N``); None for anything else, staging and deleting
    directories included."""
    entry = parse_entry(name)
    return entry.step if entry is not None and entry.kind is EntryKind.STEP else None


def rank_of_file(name: str) -> int | None:
    """The rank that wrote a file of a checkpoint: DCP shards ``__R_i.distcp`` and ``rank_R.state.json``.

    The DCP ``.metadata`` and our manifest are written by the coordinator (rank 0).
    """
    m = _DCP_SHARD_RE.match(name) or _RANK_STATE_RE.match(name)
    if m:
        return int(m.group(1))
    if name == DCP_METADATA_NAME:
        return 0
    return None


def format_pointer(step: int) -> str:
    """The text of the LATEST pointer naming ``step``: its directory name and a newline."""
    return step_dir_name(step) + "\n"


def parse_pointer(text: str) -> int:
    """Parse the content of LATEST; raises ValueError on anything but one step directory name."""
    name = text.strip()
    step = parse_step_dir_name(name)
    if step is None or text not in (name, name + "\n"):
        raise ValueError(f"LATEST should hold one step directory name like 'step_00000040', found {text[:60]!r}")
    return step


class DirectoryKind(Enum):
    """What a directory handed to a ``ckpt`` command turns out to be."""

    CHECKPOINTS = "checkpoints"  # ckpt-tool's: LATEST, the index, step directories...
    EMPTY = "empty"
    ONE_CHECKPOINT = "one checkpoint"  # a step_N directory itself
    PLAIN_DCP = "plain DCP"  # torch's own dcp.save output: .metadata and .distcp files
    OTHER = "other"


_OURS = {LATEST_NAME, INDEX_NAME, OWNER_NAME, QUARANTINE_NAME, LOCK_NAME, RUN_DIR_NAME}


def classify_directory(name: str, entries: Iterable[str]) -> DirectoryKind:
    """Classify a directory by its own name and the names it holds (one listing, no reads)."""
    names = set(entries)
    if names & _OURS or any(parse_entry(n) is not None for n in names):
        return DirectoryKind.CHECKPOINTS
    if MANIFEST_NAME in names or parse_step_dir_name(name) is not None:
        return DirectoryKind.ONE_CHECKPOINT
    if DCP_METADATA_NAME in names or any(_DCP_SHARD_RE.match(n) or n.endswith(".distcp") for n in names):
        return DirectoryKind.PLAIN_DCP
    return DirectoryKind.EMPTY if not names else DirectoryKind.OTHER
