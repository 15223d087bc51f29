"""A run's story for a picture: the loss by step, and where each checkpoint, failure, requeue,
rollback and shrink happened. Pure: the timeline (``ckpt history``'s events, oldest first) in,
points and marks out.

The loss is the training's own when a metrics file is given (JSON lines with ``step`` and
``loss``, as the reference recipe writes), else the probe loss each commit recorded (one point
per checkpoint, deleted ones included: the index keeps them). An event that names no step is
placed at the newest checkpoint committed before it (where the run would go on from).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# event -> (kind of mark, how to say it)
MARKS: Mapping[str, tuple[str, str]] = {
    "commit": ("checkpoint", "checkpoint"),
    "rank_exited": ("failure", "rank {rank} failed"),
    "hang": ("failure", "hang: rank {rank}"),
    "requeue": ("requeue", "requeued"),  # the batch script's, once (each node's ckpt run logs its own stop)
    "rollback": ("rollback", "rolled back to {step}"),
    "quarantine": ("rollback", "step {step} quarantined"),
    "nodes_left_behind": ("shrink", "left {drop} behind"),
    "straggler": ("straggler", "straggler: rank {rank}"),
    "gpu_error": ("failure", "GPU error: rank {rank}"),
}
KINDS = ("checkpoint", "failure", "requeue", "rollback", "shrink", "straggler")


@dataclass(frozen=True)
class Mark:
    step: int
    kind: str
    label: str
    time: float


@dataclass(frozen=True)
class Story:
    loss: tuple[tuple[int, float], ...]
    marks: tuple[Mark, ...]
    loss_source: str  # "metrics" or "probe loss at each checkpoint"

    def to_json(self) -> dict[str, Any]:
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
    commits: list[tuple[float, int]] = []
    marks: list[Mark] = []
    loss: list[tuple[int, float]] = []
    failures_seen: set[tuple[Any, Any, Any]] = set()
    for e in timeline:
        name, when = e.get("event"), e.get("time")
        if name not in MARKS or not isinstance(when, (int, float)):
            continue
        at = e.get("checkpoint") if name == "nodes_left_behind" else e.get("step")  # a shrink resumes from its checkpoint
        step = at if isinstance(at, int) and not isinstance(at, bool) else None
        if name == "commit" and step is not None:
            commits.append((float(when), step))
            if isinstance(e.get("probe_loss"), (int, float)):
                loss.append((step, float(e["probe_loss"])))
        if name == "rank_exited" and e.get("cause") in ("peer_failure", "terminated"):
            continue  # victims of a peer's failure: the culprit is marked
        if name in ("rank_exited", "hang"):
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
