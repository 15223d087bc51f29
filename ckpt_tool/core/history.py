"""A run's story for a picture, and for ``ckpt history``'s table. The picture: the loss by step, and where each checkpoint, failure, requeue,
rollback and shrink happened. Pure: the timeline (``ckpt history``'s events, oldest first) in,
points and marks out.

The loss is the training's own when a metrics file is given (JSON lines with ``step`` and
``loss``, as the reference recipe writes), else the probe loss each commit recorded (one point
per checkpoint, deleted ones included: the index keeps them). An event that names no step is
placed at the newest checkpoint committed before it (where the run would go on from).

The table: which events to show (``--since``, ``--event``, ``--last``) and their fields in words.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_tool.core.run_catalog import EVENTS, is_user_event
from ckpt_tool.errors import CkptError, ExitCode

# event -> (kind of mark, how to say it)
MARKS: Mapping[str, tuple[str, str]] = {
    "commit": ("checkpoint", "checkpoint"),
    "rank_exited": ("failure", "rank {rank} failed"),
    "hang": ("failure", "hang: rank {rank}"),
    "hang_report": ("failure", "hang: unattributed"),  # only when no culprit stands out (else the culprit's `hang`)
    "requeue": ("requeue", "requeued"),  # the batch script's, once (each node's ckpt run logs its own stop)
    "rollback": ("rollback", "rolled back to {step}"),
    "quarantine": ("rollback", "step {step} quarantined"),
    "nodes_left_behind": ("shrink", "left {drop} behind"),
    "replaced": ("replace", "replaced {node} with {by}"),
    "straggler": ("straggler", "straggler: rank {rank}"),
    "slow_link": ("straggler", "slow link: {node}"),
    "gpu_error": ("failure", "GPU error: rank {rank}"),
    "anomaly": ("failure", "wrong value: rank {rank}"),
}
KINDS = ("checkpoint", "failure", "requeue", "rollback", "shrink", "replace", "straggler")


@dataclass(frozen=True)
class Mark:
    """One event on the picture: the step it is placed at, its kind (the marker) and its label."""

    step: int
    kind: str
    label: str
    time: float


@dataclass(frozen=True)
class Story:
    """What ``ckpt history --plot`` draws: the loss by step, where it came from, and the run's marks."""

    loss: tuple[tuple[int, float], ...]
    marks: tuple[Mark, ...]
    loss_source: str  # "metrics" or "probe loss at each checkpoint"

    def to_json(self) -> dict[str, Any]:
        """The story as plain data: its loss points and marks, for JSON."""
        return {
            "loss_source": self.loss_source,
            "loss": [list(p) for p in self.loss],
            "marks": [{"step": m.step, "kind": m.kind, "label": m.label, "time": m.time} for m in self.marks],
        }


def _label(template: str, e: Mapping[str, Any]) -> str:
    try:
        return template.format(**{k: (", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in e.items()})
    except (KeyError, IndexError, ValueError):
        return template.split(":")[0].split("{")[0].strip() or str(e.get("event"))


def story(timeline: Sequence[Mapping[str, Any]], metrics: Sequence[tuple[int, float]] | None = None) -> Story:
    """The picture of ``timeline`` (oldest first): ``metrics``' loss when given, else each commit's
    probe loss; one mark per checkpoint, failure on a node, requeue, rollback and shrink."""
    commits: list[tuple[float, int]] = []
    marks: list[Mark] = []
    loss: list[tuple[int, float]] = []
    failures_seen: set[tuple[Any, Any, Any]] = set()
    for e in timeline:
        name, when = e.get("event"), e.get("time")
        if name not in MARKS or not isinstance(when, (int, float)):
            continue
        if name == "nodes_left_behind" and e.get("action") == "replace":
            continue  # each slot's `replaced` is marked: the job kept its size
        at = e.get("checkpoint") if name == "nodes_left_behind" else e.get("step")  # a shrink resumes from its checkpoint
        step = at if isinstance(at, int) and not isinstance(at, bool) else None
        if name == "commit" and step is not None:
            commits.append((float(when), step))
            if isinstance(e.get("probe_loss"), (int, float)):
                loss.append((step, float(e["probe_loss"])))
        if name == "rank_exited" and e.get("cause") in ("peer_failure", "terminated"):
            continue  # victims of a peer's failure: the culprit is marked
        if (name == "hang" and not e.get("culprit")) or (name == "hang_report" and e.get("attributed")):
            continue  # a hang's victims; an attributed report (its culprit's hang is marked)
        if name in ("rank_exited", "hang", "hang_report"):
            key = (e.get("round"), e.get("attempt"), e.get("node"))
            if key in failures_seen:
                continue  # one mark per failure on a node, not one per rank
            failures_seen.add(key)
        if step is None:
            before = [s for t, s in commits if t <= when]
            step = before[-1] if before else 0
        kind, template = MARKS[str(name)]
        marks.append(Mark(step, kind, _label(template, e), float(when)))
    if metrics:
        return Story(tuple(sorted(metrics)), tuple(marks), "metrics")
    return Story(tuple(sorted(dict(loss).items())), tuple(marks), "probe loss at each checkpoint")


# ----------------------------------------------------------------- ckpt history: filter and say

# Every event ckpt-tool writes to a run's events.jsonl or a checkpoint index, from the one catalog
# (``core.run_catalog``): ``--event`` takes these, any ``user.NAME`` and any other name this run's
# timeline holds.
KNOWN_EVENTS = tuple(sorted(EVENTS))

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
SINCE_EXAMPLES = "a duration back from now (45s, 30m, 2h, 1d, 1w) or a local time (2026-12-03 10:00, 2026-12-03)"


def parse_since(text: str, now: float, option: str = "--since") -> float:
    """``--since`` (or ``--until``): an epoch time from a duration back from ``now`` (``30m``,
    ``2h``, ``1d``) or a local date and time (``2026-12-03 10:00``, ISO forms)."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", value.lower())
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise CkptError(f"{option} {text!r} is neither a duration nor a time", f"give {SINCE_EXAMPLES}", ExitCode.USAGE) from None


def unknown_events(wanted: Sequence[str], timeline: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of ``--event`` that no part of ckpt-tool writes and this timeline does not hold."""
    known = set(KNOWN_EVENTS) | {str(e.get("event")) for e in timeline}
    return [w for w in wanted if w not in known and not is_user_event(w)]


def select(
    timeline: Sequence[Mapping[str, Any]],
    since: float | None = None,
    events: Sequence[str] = (),
    last: int | None = None,
    until: float | None = None,
) -> list[Mapping[str, Any]]:
    """The events at or after ``since`` and at or before ``until``, of the names in ``events``
    (all when empty), the newest ``last`` of them; oldest first, as given."""

    def inside(e: Mapping[str, Any]) -> bool:
        when = e.get("time")
        if since is None and until is None:
            return True
        return isinstance(when, (int, float)) and (since is None or when >= since) and (until is None or when <= until)

    chosen = [e for e in timeline if inside(e) and (not events or e.get("event") in events)]
    return chosen[-last:] if last is not None else chosen


def _is_epoch(key: str, value: float) -> bool:
    return (key in ("time", "created_at", "since", "started", "modified") or key.endswith(("_at", "_time"))) and value > 1e8


def say(key: str, value: Any) -> str:
    """A field's value as a person reads it in ``ckpt history``: times of day as local
    ``YYYY-MM-DD HH:MM:SS``, durations to the millisecond, losses and scores to 6 digits, no
    ``None``, no reprs (mappings as ``key value, ...``)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if _is_epoch(key, value):
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        if any(word in key for word in ("loss", "norm", "lr", "score", "ratio")):
            return f"{value:.6g}"
        return repr(round(value, 3)) if value == 0 or abs(value) >= 0.001 else f"{value:.3g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {say(str(k), v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(say(key, v) for v in value) or "-"
    return str(value)


# event -> (its sentence, the fields the sentence says): ``details`` leads with it
SENTENCES: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "hang_report": ("{summary} (stacks: {stacks})", ("summary", "stacks")),
    "replaced": ("replaced {node} with {by} ({reason})", ("node", "by", "reason")),
    "node_check": (
        "node check on {node}: {result} (exit {exit_code}, {seconds} s): {detail}",
        ("node", "result", "exit_code", "seconds", "detail"),
    ),
    "anomaly": ("{why}", ("why",)),
    "anomaly_replayed": ("{message}", ("message",)),
    "audit": ("{why}", ("why",)),
    "silent_fault": ("rank {rank} computed a wrong value at step {step}; its replay: {differences}", ("rank", "step", "differences")),
}

# the events of a wrong value, newest last: ``last_anomaly`` says the newest
ANOMALY_EVENTS = ("anomaly", "anomaly_replayed")


def last_anomaly(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The newest wrong value in words (``ckpt status``): the replay's verdict when it came, else
    the finding and what it led to (warn, stop, or a replay still under way); None: none yet."""
    found = [e for e in events if e.get("event") in ANOMALY_EVENTS and e.get("verdict") != "audited"]  # a passed audit: no wrong value
    if not found:
        return None
    e = found[-1]
    if e["event"] == "anomaly_replayed":
        return {
            "time": e.get("time"),
            "verdict": e.get("verdict"),
            "ranks": e.get("ranks"),
            "step": e.get("step"),
            "message": e.get("message"),
        }
    return {"time": e.get("time"), "verdict": None, "ranks": [e.get("rank")], "step": e.get("step"), "message": e.get("why")}


SKIPPED_FIELDS = ("time", "event", "source", "argv", "run_id")


def details(e: Mapping[str, Any], skip: tuple[str, ...] = SKIPPED_FIELDS) -> str:
    """An event's fields but its name and time, ``key=value`` as ``say`` writes them; an event
    with a sentence of its own (``SENTENCES``: ``replaced n2 with n3 (why)``) leads with it."""
    lead = ""
    said = SENTENCES.get(str(e.get("event")))
    if said is not None and all(k in e for k in said[1]):
        lead = said[0].format(**{k: say(k, e[k]) for k in said[1]})
        skip = (*skip, *said[1])
    rest = " ".join(f"{k}={say(k, v)}" for k, v in e.items() if k not in skip)
    return f"{lead} {rest}".strip() if lead else rest
