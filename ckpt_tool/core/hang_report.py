"""Who hung a job, and where. Pure: the ranks' stacks and last beats in, a report out.

When the watchdog declares a hang (``core.supervision.find_hangs``: nobody beat for longer than
the timeout of the rank behind), every rank was asked for its Python stacks (all threads: the
rank's ``faulthandler`` answers from a signal handler even when it is blocked in C, a collective
or I/O; ``py-spy`` reads a rank that cannot answer, a frozen one, from outside). Each rank's file
(``RUN_DIR/hangs/<id>/rank_R.txt``) starts with a header of facts (``header_line``): node, pid,
step and phase of its last beat, seconds silent, process state, how it answered.

``analyse`` names the culprit(s), in this order of evidence:

1. ranks that *could not answer* (frozen: SIGSTOP, a D-state read) while their peers did;
2. ranks on a node *cut off the network*: each node's watchdog, when it writes its ranks'
   stacks, also tries to reach every other node's watchdog (a TCP connect); a node that none of
   its peers could reach, while those peers reached some other node, is cut off (``cut_off``;
   with two nodes a cut looks the same from both ends, and nobody is named);
3. ranks *not inside a collective* while the others wait in one (a rank looping in Python, stuck
   in a data loader or in ``loss.item()`` on a bad GPU): a collective is a frame of
   ``torch.distributed`` on the training thread;
4. ranks *one step behind* the others (by their last beats), when everybody is in a collective;
5. ranks whose files are *missing*: their node did not answer;

and says *unattributed* when nothing stands out (every rank in the same collective at the same
step: a network fault looks the same from both ends), rather than guessing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HEADER_PREFIX = "# ckpt-tool stacks "


@dataclass(frozen=True)
class Frame:
    """One Python frame: file, line and function."""

    file: str
    line: int
    func: str

    @property
    def short(self) -> str:
        """``train.py:118 in main``: the file's name, the line and the function."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.func}"


@dataclass(frozen=True)
class RankStacks:
    """What one rank's file says: the header's facts and its threads' frames (innermost first)."""

    rank: int
    node: str = "?"
    pid: int = 0
    step: int | None = None
    phase: str = "?"
    silent_s: float | None = None
    state: str = "?"  # the process state when asked: R running, S sleeping, T stopped, D in I/O, gone
    answered: str = ""  # "faulthandler" | "py-spy"; empty: could not answer
    answer_s: float | None = None  # seconds from the request to the stacks on disk
    note: str = ""  # why it could not answer
    threads: tuple[tuple[Frame, ...], ...] = ()
    code: Mapping[str, str] = field(default_factory=dict)  # "file:line" -> the source line, when known


@dataclass(frozen=True)
class RankVerdict:
    """One rank in the report: culprit or waiting (or unknown), and where it was."""

    rank: int
    node: str
    role: str  # "culprit" | "waiting" | "unknown"
    where: str  # "tiny_gpt.py:241 in main" (innermost frame of the user's code), or "-"
    code: str  # the source line there, when known
    waiting_in: str | None  # the collective (torch.distributed function) it is blocked in
    step: int | None
    phase: str
    answered: str
    note: str = ""


@dataclass(frozen=True)
class HangReport:
    """The culprits (ranks), why they are the culprits, and every rank's verdict."""

    culprits: tuple[int, ...]
    reason: str  # why these ranks: "not in the collective the others wait in", ... or why unattributed
    verdicts: tuple[RankVerdict, ...]
    missing: tuple[int, ...] = ()  # ranks of the job with no file: their node did not answer
    isolated: tuple[str, ...] = ()  # nodes cut off the network (``cut_off``)

    @property
    def attributed(self) -> bool:
        """Whether a culprit stands out."""
        return bool(self.culprits)

    @property
    def victims(self) -> tuple[int, ...]:
        """The ranks that were waiting for the culprits."""
        return tuple(v.rank for v in self.verdicts if v.role == "waiting")

    def culprit_nodes(self) -> tuple[str, ...]:
        """The culprits' nodes (known from their files), in order, without repeats."""
        nodes = [v.node for v in self.verdicts if v.rank in self.culprits and v.node != "?"]
        return tuple(dict.fromkeys(nodes))

    def summary(self, seconds: float | None = None) -> str:
        """One line for the paged engineer: ``rank 1 on n2 in faults.py:70 in hang_forever
        (x += 1); ranks 0,2-3 waiting in all_reduce since step 12, 6.1 s``."""
        by = {v.rank: v for v in self.verdicts}
        since = f", {seconds:.1f} s" if seconds is not None else ""
        waiting = [by[r] for r in self.victims]
        steps = sorted({v.step for v in waiting if v.step is not None})
        ops = sorted({v.waiting_in for v in waiting if v.waiting_in})
        tail = ""
        if waiting:
            tail = f"; {rank_ranges([v.rank for v in waiting])} waiting" + (f" in {'/'.join(ops)}" if ops else "")
            tail += f" after step {steps[0]}" if len(steps) == 1 else ""
        if not self.culprits:
            return f"unattributed: {self.reason}{tail}{since}"
        parts = []
        for r in self.culprits:
            v = by.get(r)
            if v is None:
                parts.append(f"rank {r} (no stacks: its node did not answer)")
                continue
            code = f" ({v.code})" if v.code else ""
            where = f" in {v.where}{code}" if v.where != "-" else ""
            frozen = f", frozen: {v.note}," if v.answered != "faulthandler" and v.note else ""
            cut = ", cut off (its peers cannot reach it)," if v.node in self.isolated else ""
            parts.append(f"rank {r} on {v.node}{frozen}{cut}{where}")
        return f"{'; '.join(parts)}{tail}{since}"

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (``report.json`` beside the stacks)."""
        return {
            "culprits": list(self.culprits),
            "culprit_nodes": list(self.culprit_nodes()),
            "victims": list(self.victims),
            "attributed": self.attributed,
            "reason": self.reason,
            "missing": list(self.missing),
            "isolated": list(self.isolated),
            "summary": self.summary(),
            "ranks": [vars(v) for v in self.verdicts],
        }


# ----------------------------------------------------------------------------- parsing
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_SPY_THREAD = re.compile(r"^Thread (\d+|0x[0-9a-fA-F]+)")
_SPY_FRAME = re.compile(r"^\s+(.+) \((.+):(\d+)\)$")


def parse_stacks(text: str) -> tuple[tuple[Frame, ...], ...]:
    """The threads of a ``faulthandler`` dump (``File "f", line N in g``) or a ``py-spy dump``
    (``g (f:N)``), each innermost frame first; lines of neither are skipped."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if line.startswith("#"):  # our header and notes
            continue
        if _FH_THREAD.match(line) or _SPY_THREAD.match(line):
            threads.append([])
            continue
        m = _FH_FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m.group(1), int(m.group(2)), m.group(3)))
            continue
        m = _SPY_FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m.group(2), int(m.group(3)), m.group(1)))
    return tuple(tuple(t) for t in threads if t)


def header_line(facts: Mapping[str, Any]) -> str:
    """The first line of a rank's file: its facts as ``key=value`` (values without spaces)."""
    return HEADER_PREFIX + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in facts.items() if v is not None)


def parse_rank_file(text: str) -> RankStacks | None:
    """A rank's file (header and stacks), or None when its header is missing (not our file)."""
    first, _, rest = text.partition("\n")
    if not first.startswith(HEADER_PREFIX):
        return None
    facts = dict(kv.split("=", 1) for kv in first[len(HEADER_PREFIX) :].split() if "=" in kv)

    def number(key: str, kind: type) -> Any:
        try:
            return kind(facts[key])
        except (KeyError, ValueError):
            return None

    rank = number("rank", int)
    if rank is None:
        return None
    code = {}
    for line in rest.splitlines():
        if line.startswith("# code "):  # "# code FILE:LINE SOURCE"
            where, _, source = line[len("# code ") :].partition(" ")
            code[where] = source
    return RankStacks(
        rank=rank,
        node=facts.get("node", "?"),
        pid=number("pid", int) or 0,
        step=number("step", int),
        phase=facts.get("phase", "?"),
        silent_s=number("silent_s", float),
        state=facts.get("state", "?"),
        answered=facts.get("answered", ""),
        answer_s=number("answer_s", float),
        note=facts.get("note", "").replace("_", " "),
        threads=parse_stacks(rest),
        code=code,
    )


# ----------------------------------------------------------------------------- reading a stack
# torch, the standard library (not its site-packages: a user's installed package is theirs) and
# ckpt-tool's own library code; everything else is the user's (a recipe, a package of theirs)
_LIBRARY = re.compile(r"/torch/|<frozen |/lib/python3\.\d+/(?!site-packages/|dist-packages/)|/ckpt_tool/(training|supervise|store|core)/")


def training_thread(threads: Sequence[tuple[Frame, ...]]) -> tuple[Frame, ...]:
    """The thread that runs the training: the one whose outermost frame is not a
    ``threading`` bootstrap (the main thread); the first one when all are."""
    for t in threads:
        if t and not t[-1].file.endswith("threading.py"):
            return t
    return threads[0] if threads else ()


def collective_of(frames: Sequence[Frame]) -> str | None:
    """The ``torch.distributed`` collective the thread is blocked in (``all_reduce``,
    ``barrier``, ``all_gather_into_tensor``...): the innermost function of
    ``distributed_c10d.py``, else the outermost ``torch.distributed`` frame (FSDP's, DTensor's);
    None when the thread is in none."""
    outer = None
    for f in frames:  # innermost first
        if f.file.endswith("/torch/distributed/distributed_c10d.py"):
            return f.func
        if "/torch/distributed/" in f.file and "/elastic/" not in f.file:
            outer = f.func
    return outer


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's code (not torch, not the standard library, not
    ckpt-tool's library): where the training script stands."""
    for f in frames:
        if not _LIBRARY.search(f.file):
            return f
    return None


def where_frame(frames: Sequence[Frame]) -> Frame | None:
    """The frame a report names: the user's innermost (``user_frame``), else the innermost one."""
    return user_frame(frames) or (frames[0] if frames else None)


# ----------------------------------------------------------------------------- the verdict
def cut_off(reach: Mapping[str, Mapping[str, bool]]) -> tuple[str, ...]:
    """The nodes cut off the network, from what each node's watchdog could reach (``reach[a][b]``:
    node ``a`` reached node ``b``): a node that every peer which probed it failed to reach, where
    each of those peers reached some other node (its own network works), and that reached nobody
    itself (or did not say). Two nodes that cannot reach each other name nobody."""
    nodes = set(reach) | {b for r in reach.values() for b in r}
    out = []
    for x in sorted(nodes):
        probers = [a for a, r in reach.items() if a != x and x in r]
        if not probers or any(reach[a][x] for a in probers):
            continue
        if not all(any(ok for b, ok in reach[a].items() if b != x) for a in probers):
            continue
        if any(reach.get(x, {}).values()):
            continue
        out.append(x)
    return tuple(out)


def analyse(ranks: Iterable[RankStacks], world: int | None = None, reach: Mapping[str, Mapping[str, bool]] | None = None) -> HangReport:
    """Name the culprit(s) of a hang from every rank's stacks and last beat, and what each node
    could reach (see the module's docstring for the order of evidence). ``world``: the job's
    world size, when known, so that ranks with no file at all are seen."""
    by = {r.rank: r for r in ranks}
    isolated = set(cut_off(reach or {}))
    missing = tuple(r for r in range(world) if r not in by) if world else ()
    spoke = {r for r, s in by.items() if s.answered == "faulthandler" and s.threads}  # answered by itself
    answered = {r for r, s in by.items() if s.threads}  # stacks from the rank, or read from outside (py-spy)
    frames = {r: training_thread(by[r].threads) for r in answered}
    ops = {r: collective_of(frames[r]) for r in answered}
    in_collective = {r for r in answered if ops[r]}

    culprits: tuple[int, ...] = ()
    reason = ""
    # a rank gone by the time it was asked (another node's watchdog ended the attempt) is not frozen
    frozen = tuple(sorted(r for r in set(by) - spoke if by[r].state != "gone"))
    outside = tuple(sorted(answered - in_collective))
    if frozen and spoke:
        culprits, reason = frozen, "could not answer (frozen) while the others did"
    elif isolated and any(s.node in isolated for s in by.values()):
        culprits = tuple(sorted(r for r, s in by.items() if s.node in isolated))
        reason = f"{', '.join(sorted(isolated))} cannot be reached by its peers (its network?), which reach each other"
    elif in_collective and outside:
        culprits, reason = outside, "not inside the collective the others wait in"
    elif in_collective and not outside:
        steps = {r: by[r].step for r in in_collective if by[r].step is not None}
        low = min(steps.values()) if steps else None
        behind = tuple(sorted(r for r, s in steps.items() if s == low)) if low is not None else ()
        if missing and in_collective:
            culprits, reason = missing, "their node did not answer while the others wait in a collective"
        elif low is not None and len(behind) < len(steps):
            culprits, reason = behind, "a step behind the others"
        else:
            names = sorted({str(o) for o in ops.values() if o})
            reason = f"every rank waits in {'/'.join(names)} at the same step: the fault is between them (the network?)"
    elif not by:
        reason = "no rank answered and no stacks were written"
    elif not answered:
        reason = "no rank could answer (every one frozen or gone)"
    else:
        steps = {r: by[r].step for r in by if by[r].step is not None}
        low = min(steps.values()) if steps else None
        behind = tuple(sorted(r for r, s in steps.items() if s == low)) if low is not None else ()
        if low is not None and len(behind) < len(steps):
            culprits, reason = behind, "a step behind the others (no rank is in a collective)"
        else:
            reason = "no rank is in a collective and none is behind: every rank is stuck on its own (a shared filesystem? a bug?)"

    verdicts = []
    for r in sorted(by):
        s = by[r]
        f = where_frame(frames.get(r, ()))
        where = f.short if f else "-"
        code = s.code.get(f"{f.file}:{f.line}", "") if f else ""
        role = "culprit" if r in culprits else ("waiting" if culprits else "unknown")
        note = s.note if r not in spoke else ""
        verdicts.append(RankVerdict(r, s.node, role, where, code, ops.get(r), s.step, s.phase, s.answered, note))
    return HangReport(culprits, reason, tuple(verdicts), missing, tuple(sorted(isolated)))


def moving(ranks: Iterable[RankStacks], within_s: float = 2.0) -> float | None:
    """The longest silence (seconds) when every rank beat within ``within_s`` of being asked:
    a job that moves (``ckpt stacks`` on a live job: a snapshot, nobody stuck); else None."""
    silences = [r.silent_s for r in ranks]
    if not silences or any(s is None or s > within_s for s in silences):
        return None
    return max(s for s in silences if s is not None)


def report_of(data: Mapping[str, Any]) -> HangReport:
    """A report back from its ``to_json`` (``report.json``)."""
    verdicts = tuple(RankVerdict(**{k: v.get(k) for k in RankVerdict.__dataclass_fields__}) for v in data.get("ranks", ()))
    return HangReport(
        tuple(data.get("culprits", ())),
        str(data.get("reason", "")),
        verdicts,
        tuple(data.get("missing", ())),
        tuple(data.get("isolated", ())),
    )


def rank_ranges(ranks: Iterable[int]) -> str:
    """``ranks 0,2-5``: the ranks as runs of consecutive numbers (``rank 3`` for one)."""
    rs = sorted(set(ranks))
    runs: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        runs.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(runs)
