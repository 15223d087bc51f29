"""Where a run's time went: its wall time split by what it was spent on, per interruption and in
total, and its effective training time ratio (ETTR = productive / wall). Pure: the run's
timeline (``ckpt history``'s merged events, oldest first) in, an ``Account`` out.

The kinds of time (``KINDS``), every second of the run's wall time in exactly one:

- ``productive``: training steps that were kept, less the checkpoints' blocked time;
- ``checkpoint``: the time a save blocked training (``blocked_s`` of each commit), and a stop's
  checkpoint (a preemption's, a round end's: from the request to the commit);
- ``overhead``: starting the job (the batch script to the ranks' first beat) and ending it;
- ``detection``: from the failure (a crash; a hang's last beat) to the ranks being gone;
- ``restart``: from there (or a stop's commit) to the new ranks' first beat, a requeue's own
  teardown and start included;
- ``queue``: a requeued job waiting in SLURM's queue (requeue to the next ``job_start``);
- ``load``: the new ranks' first beat to their first step after loading a checkpoint;
- ``recompute``: training again the steps done before the failure (the checkpoint's step up to
  the newest step reached before), the work lost since the checkpoint.

An ``Interruption`` is one failure or stop and everything it cost until training was back past
where it had been. Steps are placed in time by the progress the events carry: each commit
(``created_at``: when its step ended), each failure's step, a stop's step, a resume's
checkpoint; between two of them the steps are spread evenly.

Time between the end of a job (finished, cancelled, failed) and a later start of the same run
directory (a resubmission) is ``off``: no job existed, it is outside the wall time.
Nodes: the job's size is the most nodes it trained on; time on fewer (a shrink) is counted in
node-hours lost, and ``ettr_nodes`` weighs productive time by the share of nodes that trained.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

KINDS = ("productive", "checkpoint", "overhead", "detection", "restart", "queue", "load", "recompute")
LOST_KINDS = ("detection", "restart", "queue", "load", "recompute")  # what failures cost (and a stop's checkpoint)
WORDS = {
    "productive": "training",
    "checkpoint": "checkpoint stalls",
    "overhead": "job start and end",
    "detection": "detection (failure to the kill)",
    "restart": "restart (kill to the first beat)",
    "queue": "queued after a requeue",
    "load": "loading the checkpoint",
    "recompute": "recomputing lost steps",
}
FINAL = frozenset({"job_finished", "job_failed", "cancelled", "job_stopped", "max_requeues_reached", "requeue_failed", "crash_loop"})
VICTIM_CAUSES = ("peer_failure", "terminated")
FAILURE_EVENTS = ("rank_exited", "hang", "anomaly", "audit")
PLAIN_FINAL = frozenset({"finished", "failed", "fatal"})  # the end of a run under `ckpt run` alone (no batch script)


@dataclass(frozen=True)
class Span:
    """Wall time ``start``..``end`` (epoch seconds) of one kind; ``interruption``: the index of the
    interruption it is charged to (None: not a failure's cost)."""

    start: float
    end: float
    kind: str
    interruption: int | None = None
    nodes: int = 1  # nodes training (or set to) during it

    @property
    def seconds(self) -> float:
        """Its length."""
        return self.end - self.start


@dataclass(frozen=True)
class Interruption:
    """One failure or stop: what (``kind``: crash, hang, wrong value, preemption, stop, node left
    behind, cancelled), when, where, the step reached, the checkpoint training went on from, the
    steps trained again, and the seconds it cost by kind; ``then``: what followed (a node left
    behind, replaced, the job requeued)."""

    index: int
    kind: str
    time: float
    label: str
    node: str | None = None
    step: int | None = None
    resumed_from: int | None = None
    steps_recomputed: int = 0
    seconds: Mapping[str, float] = field(default_factory=dict)
    then: tuple[str, ...] = ()

    @property
    def down_s(self) -> float:
        """Seconds without training: every cost but the recompute."""
        return sum(v for k, v in self.seconds.items() if k != "recompute")

    @property
    def lost_s(self) -> float:
        """Every second it cost, the recompute included."""
        return sum(self.seconds.values())

    def to_json(self) -> dict[str, Any]:
        """As plain data."""
        return {
            "index": self.index,
            "kind": self.kind,
            "time": self.time,
            "label": self.label,
            "node": self.node,
            "step": self.step,
            "resumed_from": self.resumed_from,
            "steps_recomputed": self.steps_recomputed,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "down_s": round(self.down_s, 3),
            "lost_s": round(self.lost_s, 3),
            "then": list(self.then),
        }


@dataclass(frozen=True)
class Account:
    """The run's time: ``spans`` cover ``start``..``end`` but the gaps when no job existed;
    ``progress``: each stretch of training as (time, step) points; ``checkpoints``: (time, step)
    of each commit; ``lanes``: each node's (start, end, state) with state active, standby or left
    behind; ``nodes_full``: the job's size; ``running``: no final event yet (``end`` is the time
    it was asked for); ``final``: the event that ended it."""

    start: float
    end: float
    spans: tuple[Span, ...]
    interruptions: tuple[Interruption, ...]
    progress: tuple[tuple[tuple[float, int], ...], ...]
    checkpoints: tuple[tuple[float, int], ...]
    lanes: Mapping[str, tuple[tuple[float, float, str], ...]]
    nodes_full: int
    running: bool
    final: str | None

    @property
    def wall_s(self) -> float:
        """Wall time of the run: its first start to its end, less the time no job existed."""
        return sum(s.seconds for s in self.spans)

    @property
    def off_s(self) -> float:
        """Time between a job's end and a later start (a resubmission): not in the wall time."""
        return max(0.0, self.end - self.start - self.wall_s)

    @property
    def node_seconds_lost(self) -> float:
        """Node-seconds the job ran below its size (queue time not counted)."""
        return sum((self.nodes_full - s.nodes) * s.seconds for s in self.spans if s.kind != "queue" and s.nodes < self.nodes_full)

    @property
    def shrank(self) -> bool:
        """Whether the job ran below its size for a share of its node-time that counts (0.1%; a
        standby that takes a slot in the same second does not)."""
        return self.node_seconds_lost > 0.001 * self.nodes_full * self.wall_s

    @property
    def productive_node_share(self) -> float:
        """Productive seconds weighed by the share of the job's nodes that trained."""
        return sum(s.seconds * s.nodes / self.nodes_full for s in self.spans if s.kind == "productive")

    def window(self, lo: float | None, hi: float | None) -> Account:
        """The account of ``lo``..``hi`` only (``--since``/``--until``): spans cut there, the
        interruptions that happened in it."""
        lo = self.start if lo is None else max(lo, self.start)
        hi = self.end if hi is None else min(hi, self.end)
        spans = tuple(replace(s, start=max(s.start, lo), end=min(s.end, hi)) for s in self.spans if s.end > lo and s.start < hi)
        chosen = tuple(i for i in self.interruptions if lo <= i.time <= hi)
        return replace(
            self,
            start=lo,
            end=max(lo, hi),
            spans=spans,
            interruptions=tuple(_costs(i, spans) for i in chosen),
            progress=tuple(p for p in (tuple(x for x in run if lo <= x[0] <= hi) for run in self.progress) if p),
            checkpoints=tuple(c for c in self.checkpoints if lo <= c[0] <= hi),
        )

    def totals(self) -> dict[str, float]:
        """Seconds by kind (every kind, zeros included)."""
        found = dict.fromkeys(KINDS, 0.0)
        for s in self.spans:
            found[s.kind] += s.seconds
        return found

    @property
    def ettr(self) -> float | None:
        """Productive / wall time (None before any wall time)."""
        return self.totals()["productive"] / self.wall_s if self.wall_s > 0 else None

    @property
    def ettr_nodes(self) -> float | None:
        """Productive node-time / the job's size x wall time (equals ``ettr`` when the size never changed)."""
        return self.productive_node_share / self.wall_s if self.wall_s > 0 else None

    @property
    def steps_recomputed(self) -> int:
        """Steps trained twice, over all interruptions."""
        return sum(i.steps_recomputed for i in self.interruptions)

    @property
    def down_s(self) -> float:
        """Seconds without training because of interruptions (recompute not included)."""
        return sum(i.down_s for i in self.interruptions)

    def summary(self) -> str:
        """One line: ``3 interruptions, 41 steps recomputed, 6 min down, ETTR 96.8%``."""
        n = len(self.interruptions)
        parts = [
            f"{n} interruption{'' if n == 1 else 's'}",
            f"{self.steps_recomputed} step{'' if self.steps_recomputed == 1 else 's'} recomputed",
        ]
        parts.append(f"{duration(self.down_s)} down")
        ettr = self.ettr
        text = ", ".join(parts) + (f", ETTR {ettr:.1%}" if ettr is not None else "")
        if self.shrank and self.ettr_nodes is not None:
            text += f" ({self.ettr_nodes:.1%} of the node-hours: {node_time(self.node_seconds_lost)} on fewer nodes)"
        return text + (" so far" if self.running else "")

    def dominant(self) -> tuple[str, float] | None:
        """The lost kind that cost the most (checkpoint stalls included) and its seconds; None when nothing was lost."""
        totals = self.totals()
        kind = max(("checkpoint", *LOST_KINDS), key=lambda k: totals[k])
        return (kind, totals[kind]) if totals[kind] > 0 else None

    def to_json(self) -> dict[str, Any]:
        """As plain data (``--json``)."""
        totals = self.totals()
        return {
            "summary": self.summary(),
            "start": self.start,
            "end": self.end,
            "running": self.running,
            "final": self.final,
            "wall_s": round(self.wall_s, 3),
            "off_s": round(self.off_s, 3),
            "seconds": {k: round(v, 3) for k, v in totals.items()},
            "ettr": None if self.ettr is None else round(self.ettr, 6),
            "ettr_nodes": None if self.ettr_nodes is None else round(self.ettr_nodes, 6),
            "nodes_full": self.nodes_full,
            "node_hours_lost": round(self.node_seconds_lost / 3600, 6),
            "steps_recomputed": self.steps_recomputed,
            "down_s": round(self.down_s, 3),
            "interruptions": [i.to_json() for i in self.interruptions],
        }


def duration(seconds: float) -> str:
    """``42 s``, ``6.2 min``, ``3.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def node_time(node_seconds: float) -> str:
    """``12 node-s``, ``3.5 node-min``, ``0.8 node-h``."""
    if node_seconds < 60:
        return f"{node_seconds:.0f} node-s"
    if node_seconds < 360:
        return f"{node_seconds / 60:.1f} node-min"
    return f"{node_seconds / 3600:.1f} node-h"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(n) for n in value)
    return tuple(n for n in str(value or "").replace(" ", ",").split(",") if n and n != "-")


def _failure(e: Mapping[str, Any], stacks_s: float = 0.0) -> tuple[str, float, str] | None:
    """(kind, time of the failure, label) when ``e`` is a failure's own event (not a victim's);
    a hang's failure is its last beat: ``silent_s`` before the hang was found, which was
    ``stacks_s`` (its report's time to write every rank's stacks) before the event."""
    name, when = e.get("event"), float(e["time"])
    node = e.get("node")
    where = f" on {node}" if node else ""
    if name == "rank_exited" and e.get("cause") not in VICTIM_CAUSES:
        return "crash", when, f"rank {e.get('rank')} {e.get('cause') or 'failed'}{where}"
    if name == "hang":
        silent = e.get("silent_s")
        start = when - stacks_s - (float(silent) if isinstance(silent, (int, float)) and silent > 0 else 0.0)
        return "hang", start, f"hang: rank {e.get('rank')}{where}"
    if name == "anomaly" and e.get("action") == "replay":
        return "wrong value", when, f"wrong value: rank {e.get('rank')} ({e.get('kind') or e.get('field')})"
    if name == "audit" and e.get("action") == "replay":
        return "audit", when, f"audit from step {e.get('from_step')}"
    return None


class _Builder:
    """The walk over the timeline (``account``): the state now, the spans so far."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate  # seconds per step of the run, where progress points do not say
        self.spans: list[Span] = []
        self.interruptions: list[Interruption] = []
        self.state: str | None = None  # a kind, "training", or None (no job)
        self.since = 0.0
        self.cur: int | None = None  # the interruption being paid for
        self.high = 0  # the newest step reached
        self.committed = False
        self.train_from = 0
        self.redo_until = 0
        self.points: list[tuple[float, int]] = []
        self.progress: list[tuple[tuple[float, int], ...]] = []
        self.stalls: list[tuple[float, float]] = []
        self.detect_end: float | None = None
        self.expect_resume = False

    def add(self, end: float, kind: str, charged: bool = True) -> None:
        """The time from ``since`` to ``end`` is ``kind`` (charged to the current interruption)."""
        if end > self.since:
            whose = self.cur if charged and kind != "overhead" else None
            last = self.spans[-1] if self.spans else None
            if last is not None and last.kind == kind and last.interruption == whose and last.end == self.since:
                self.spans[-1] = replace(last, end=end)
            else:
                self.spans.append(Span(self.since, end, kind, whose))
        self.since = max(self.since, end)

    def close(self, t: float) -> None:
        """End the current state at ``t`` (training split into recompute, productive and stalls)."""
        if self.state == "training":
            self.end_training(t, None)
        elif self.state == "detection":
            cut = min(max(self.detect_end or t, self.since), t)
            self.add(cut, "detection")
            self.add(t, "restart")
        elif self.state is not None:
            self.add(t, self.state)
        self.since = max(self.since, t)

    def begin_training(self, t: float, step: int) -> None:
        self.close(t)
        self.state, self.train_from, self.redo_until = "training", step, max(self.high, step)
        self.points = [(t, step)]
        if self.cur is not None:
            self.interruptions[self.cur] = replace(self.interruptions[self.cur], resumed_from=step)

    def end_training(self, t: float, step: int | None) -> None:
        t = max(t, self.since)
        if step is not None and step >= self.train_from:
            self.points.append((t, step))
        pts = sorted(self.points)
        cross = self._crossing(pts, t)
        self.add(cross, "recompute")
        if self.cur is not None:  # the steps trained again in this stretch, charged to the interruption it recovers from
            redone = max(0, min(self.redo_until, max(s for _, s in pts)) - self.train_from)
            i = self.interruptions[self.cur]
            self.interruptions[self.cur] = replace(i, steps_recomputed=i.steps_recomputed + redone)
        self.cur = None  # training got past where it had been: the interruption is paid
        self._productive(t)
        self.high = max([self.high, *(s for _, s in pts)])
        self.progress.append(tuple(pts))
        self.state = None

    def _crossing(self, pts: list[tuple[float, int]], t: float) -> float:
        """When training reached ``redo_until`` again (``t`` if it never did)."""
        if self.redo_until <= self.train_from:
            return self.since
        for (t0, s0), (t1, s1) in zip(pts, pts[1:], strict=False):
            if s1 >= self.redo_until and s1 > s0:
                return min(t, t0 + (self.redo_until - s0) / (s1 - s0) * (t1 - t0))
        if pts[-1][1] >= self.redo_until:
            return min(t, pts[-1][0])
        last_t, last_s = pts[-1]
        if self.rate is not None and last_t < t:  # no point says: the run's pace from the last one
            return min(t, last_t + (self.redo_until - last_s) * self.rate)
        return t

    def _productive(self, t: float) -> None:
        """From ``since`` to ``t``: training, less the stalls of commits in it."""
        for start, blocked in sorted(self.stalls):
            if start >= t:
                break
            lo, hi = max(start, self.since), min(start + blocked, t)
            if hi > lo:
                self.add(lo, "productive", charged=False)
                self.add(hi, "checkpoint", charged=False)
        self.add(t, "productive", charged=False)

    def interrupt(self, kind: str, when: float, label: str, node: Any, step: int | None) -> None:
        """A failure or a stop at ``when``: training (if any) ends there."""
        if self.state == "training":
            self.end_training(when, step)
        else:
            self.close(when)
        if step is not None:
            self.high = max(self.high, step)
        self.cur = len(self.interruptions)
        self.interruptions.append(Interruption(self.cur, kind, when, label, str(node) if node else None, step))
        self.detect_end = None

    def reached(self, step: int | None) -> None:
        """A stop's step: the newest reached, and the step of the interruption that stopped there."""
        if step is None:
            return
        self.high = max(self.high, step)
        if self.cur is not None and self.interruptions[self.cur].step is None:
            self.interruptions[self.cur] = replace(self.interruptions[self.cur], step=step)

    def then(self, text: str) -> None:
        """Something that followed the current interruption (or the newest one)."""
        target = self.cur if self.cur is not None else (len(self.interruptions) - 1 if self.interruptions else None)
        if target is not None:
            i = self.interruptions[target]
            if text not in i.then:
                self.interruptions[target] = replace(i, then=(*i.then, text))


def _commits(timeline: Sequence[Mapping[str, Any]]) -> list[tuple[float, int, Any]]:
    """(when its step ended, step, run id) of each commit, oldest first."""
    return sorted(
        (float(e["created_at"]), s, e.get("run_id"))
        for e in timeline
        if e.get("event") == "commit" and isinstance(e.get("created_at"), (int, float)) and (s := _int(e.get("step"))) is not None
    )


def commit_gaps(timeline: Sequence[Mapping[str, Any]]) -> list[tuple[float, int]]:
    """(seconds, steps) between consecutive commits of one run, where the step grew (the run's pace; its interval)."""
    pts = _commits(timeline)
    return [(t1 - t0, s1 - s0) for (t0, s0, r0), (t1, s1, r1) in zip(pts, pts[1:], strict=False) if s1 > s0 and r0 == r1]


def _pace(timeline: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds per step of the run: the median over consecutive commits of one run."""
    rates = [seconds / steps for seconds, steps in commit_gaps(timeline)]
    return statistics.median(rates) if rates else None


def account(timeline: Sequence[Mapping[str, Any]], now: float | None = None) -> Account | None:
    """The account of a run from its ``timeline`` (events with ``event`` and ``time``, oldest
    first; run and checkpoint events merged). ``now``: where a running job's account ends
    (default: its newest event). None when the timeline holds no start of a job."""
    events = sorted((e for e in timeline if isinstance(e.get("time"), (int, float))), key=lambda e: float(e["time"]))
    first = next((e for e in events if e.get("event") in ("job_start", "start")), None)
    if first is None:
        return None
    b = _Builder(_pace(events))
    launched = first.get("launched")  # ckpt run's process start, before its first event
    start = float(launched) if isinstance(launched, (int, float)) and 0 <= float(first["time"]) - launched < 600 else float(first["time"])
    b.since, b.state = start, "overhead"
    seen: set[tuple[Any, ...]] = set()
    chain = any(e.get("event") == "job_start" for e in events)  # under `ckpt submit`: the batch script says when the job ends
    stacks = {
        (e.get("round"), e.get("attempt"), e.get("node")): float(e["stacks_s"])
        for e in events
        if e.get("event") == "hang_report" and isinstance(e.get("stacks_s"), (int, float))
    }
    final: str | None = None
    off_since: float | None = None
    nodes = _Nodes()

    def once(kind: str, e: Mapping[str, Any]) -> bool:
        """The first ``kind`` of its round and attempt (each node's ``ckpt run`` logs its own)."""
        k = (kind, e.get("round"), e.get("attempt"))
        if k in seen:
            return False
        seen.add(k)
        return True

    previous = start
    for e in events:
        name, t = e.get("event"), float(e["time"])
        if t < start and e is not first:
            continue
        previous, t_prev = t, previous
        nodes.observe(e, t)
        if name == "commit":
            step = _int(e.get("step"))
            made = e.get("created_at")
            if step is not None:
                b.committed = True
                if b.state == "training" and isinstance(made, (int, float)) and step >= b.train_from:
                    b.points.append((float(made), step))
                blocked = e.get("blocked_s")
                if isinstance(made, (int, float)) and isinstance(blocked, (int, float)) and blocked > 0:
                    b.stalls.append((float(made), float(blocked)))
            continue
        if name == "job_start" and final is not None and b.state is not None:  # the ended job's stop never came
            b.close(t_prev)
            b.state, off_since = None, t_prev
        if b.state is None and final is not None:  # a job after the run had ended (a resubmission)
            if name not in ("job_start", "start"):
                continue  # the ended job's last words (another node's `finished`, its stop)
            b.since, final = t, None
            b.state = "restart" if b.cur is not None else "overhead"
        if name in ("job_start", "start") and b.state in ("queue", None):
            b.close(t)
            b.state = "restart" if b.cur is not None else "overhead"
            continue
        if name == "recover" and e.get("action") == "resume":
            b.expect_resume = True
        if name == "ranks_started" and once("ranks_started", e):
            b.close(t)
            if b.committed or b.expect_resume:
                b.state = "load"  # a checkpoint to load: training starts at `resumed`
            else:
                b.begin_training(t, 0)
            continue
        if name == "resumed" and once("resumed", e):
            step = _int(e.get("checkpoint"))
            b.begin_training(t, step if step is not None else _int(e.get("step")) or 0)
            continue
        fail = _failure(e, stacks.get((e.get("round"), e.get("attempt"), e.get("node")), 0.0)) if name in FAILURE_EVENTS else None
        if fail is not None and once("failure", e):
            kind, when, label = fail
            b.interrupt(kind, max(when, b.since), label, e.get("node"), _int(e.get("step")))
            b.state, b.detect_end = "detection", None
            continue
        if name in ("rank_exited", "killed_ranks", "hang_report") and b.state == "detection":
            b.detect_end = t
            continue
        if name == "stop_requested" and once("stop", e):
            purpose = e.get("purpose")
            signals = ", ".join(map(str, e.get("signals") or [])) or "a request"
            if b.state == "training" or b.cur is None:
                kind = {"requeue": "preemption", "leave_node": "node left behind"}.get(str(purpose), "stop")
                b.interrupt(kind, t, f"{kind} ({signals})", None, None)
            else:
                b.close(t)
            b.state = "checkpoint"
            continue
        if name == "round_ending" and once("stop", e) and b.state == "training":
            b.interrupt("node left behind", t, f"suspect {', '.join(_names(e.get('suspects')))}", e.get("node"), None)
            b.state = "checkpoint"
            continue
        if name in ("stopped_for_requeue", "round_ended") and once("stopped", e):
            step = _int(e.get("step"))
            b.reached(step)
            if final is not None:  # a cancelled job's stop: its end
                b.close(t)
                b.state, off_since = None, t
                continue
            if b.state == "training":
                b.interrupt("stop", t, "stopped", e.get("node"), step)
            b.close(t)
            b.state = "restart"
            continue
        if name == "restarted" and b.state == "detection":
            b.close(t)
            b.state = "restart"
            continue
        if name in ("quarantine", "rollback"):
            b.then(f"step {e.get('step')} quarantined" if name == "quarantine" else f"rolled back to step {e.get('step')}")
            continue
        if name == "nodes_left_behind":
            b.then(f"{', '.join(_names(e.get('drop')))} left behind ({e.get('action')})")
            continue
        if name == "replaced":
            b.then(f"{e.get('node')} replaced by {e.get('by')}")
            continue
        if name == "requeue":
            b.then("requeued")
            if b.state == "training":
                b.interrupt("requeue", t, "requeued", None, None)
            b.close(t)
            b.state = "queue"
            continue
        if name in PLAIN_FINAL and not chain:  # each node's ckpt run says it ended: the first ends the run (the rest follow at once)
            b.close(t)
            b.state, final, off_since = None, str(name), t
            continue
        if name == "finished" and once("finished", e) and b.state == "training":
            b.close(t)
            b.state = "overhead"
            continue
        if name in ("cancelled", "job_stopped"):
            if b.state == "training":
                b.interrupt("cancelled", t, f"cancelled ({e.get('cause') or 'scancel'})", None, None)
                b.state = "checkpoint"  # the ranks checkpoint at their next step, then stop
            else:
                b.then("cancelled")
            final = str(name)
            if b.state in ("queue", "overhead", None):
                b.close(t)
                b.state, off_since = None, t
            continue
        if name in FINAL:
            b.close(t)
            b.state, final, off_since = None, str(name), t
            continue
    end = off_since if b.state is None and off_since is not None else max(float(now) if now is not None else 0.0, float(events[-1]["time"]))
    b.close(end)  # a running job: up to now
    full, spans, lanes = nodes.weigh(b.spans, end)
    commits = tuple((t, s) for t, s, _ in _commits(events))
    interruptions = tuple(_costs(i, spans) for i in b.interruptions)
    return Account(
        start=start,
        end=end,
        spans=spans,
        interruptions=interruptions,
        progress=tuple(b.progress),
        checkpoints=commits,
        lanes=lanes,
        nodes_full=full,
        running=final is None,
        final=final,
    )


def _costs(i: Interruption, spans: Sequence[Span]) -> Interruption:
    found: dict[str, float] = {}
    for s in spans:
        if s.interruption == i.index:
            found[s.kind] = found.get(s.kind, 0.0) + s.seconds
    return replace(i, seconds=found)


class _Nodes:
    """Which nodes trained when: from ``nodes_active`` (the chain's rounds), else the nodes whose
    ``ckpt run`` started in each round; ``nodes_left_behind`` and ``replaced`` move nodes out."""

    def __init__(self) -> None:
        self.changes: list[tuple[float, dict[str, str]]] = []  # (time, node -> state) after each change
        self.state: dict[str, str] = {}
        self.rounds: dict[str, set[str]] = {}
        self.chain = False

    def _set(self, t: float, new: dict[str, str]) -> None:
        if new != self.state:
            self.state = new
            self.changes.append((t, dict(new)))

    def observe(self, e: Mapping[str, Any], t: float) -> None:
        name = e.get("event")
        if name == "nodes_active":
            self.chain = True
            new = {n: s for n, s in self.state.items() if s == "left behind"}
            new.update(dict.fromkeys(_names(e.get("standby")), "standby"))
            new.update(dict.fromkeys(_names(e.get("active")), "active"))
            self._set(t, new)
        elif name == "nodes_left_behind":
            self._set(t, {**self.state, **dict.fromkeys(_names(e.get("drop")), "left behind")})
        elif name == "replaced":
            self._set(t, {**self.state, str(e.get("node")): "left behind", str(e.get("by")): "active"})
        elif name == "start" and not self.chain and isinstance(e.get("node"), str):
            rnd = str(e.get("round"))
            fresh = rnd not in self.rounds
            members = self.rounds.setdefault(rnd, set())
            members.add(e["node"])
            new = (
                {n: ("active" if n in members else "left behind") for n in set(self.state) | members}
                if fresh
                else {**self.state, e["node"]: "active"}
            )
            if fresh and not self.state:
                new = dict.fromkeys(members, "active")
            self._set(t, new)

    def weigh(self, spans: Sequence[Span], end: float) -> tuple[int, tuple[Span, ...], dict[str, tuple[tuple[float, float, str], ...]]]:
        """(the job's size, ``spans`` cut where the node count changed, each with its count, each node's lane)."""
        if not self.changes:
            return 1, tuple(spans), {}
        counts = [sum(1 for v in c.values() if v == "active") for _, c in self.changes]
        full = max(counts) or 1
        times = [t for t, _ in self.changes]
        cut = tuple(replace(s, start=lo, end=hi, nodes=n) for s in spans for lo, hi, n in _pieces(s.start, s.end, times, counts))
        lanes: dict[str, list[tuple[float, float, str]]] = {}
        for (t, c), t_end in zip(self.changes, [*times[1:], end], strict=True):
            for node, state in c.items():
                lane = lanes.setdefault(node, [])
                if lane and lane[-1][2] == state and lane[-1][1] == t:
                    lane[-1] = (lane[-1][0], t_end, state)
                else:
                    lane.append((t, t_end, state))
        return full, cut, {n: tuple(v) for n, v in sorted(lanes.items())}


def _pieces(lo: float, hi: float, times: list[float], counts: list[int]) -> list[tuple[float, float, int]]:
    """``lo``..``hi`` cut at ``times`` (each a change to ``counts[i]`` nodes; before the first: the first)."""
    out: list[tuple[float, float, int]] = []
    cuts = [lo, *(t for t in times if lo < t < hi), hi]
    for a, b in zip(cuts, cuts[1:], strict=False):
        idx = max((i for i, t in enumerate(times) if t <= a), default=0)
        out.append((a, b, counts[idx]))
    return out
