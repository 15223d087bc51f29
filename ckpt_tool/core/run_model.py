"""The run against the model (``ckpt plan --run-dir``): what a run measured (``core.account``), in
the terms of Daly's model (``core.interval``), what the model predicts for it, the cost that
dominates and what would move it. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckpt_tool.core.account import Account, commit_gaps, duration
from ckpt_tool.core.interval import goodput, plan_interval


@dataclass(frozen=True)
class RunModel:
    """What a run measured, in the terms of Daly's model (``core.interval``), and what the model
    predicts for them. Seconds; None where the run does not say (no commit with ``blocked_s``, no
    two commits of one run, no failure)."""

    checkpoint_s: float | None  # median blocked time of a save
    interval_s: float | None  # median training time between two checkpoints (their spacing less a save)
    mtbf_s: float | None  # wall time per interruption (None: none yet)
    restart_s: float | None  # mean time without training per interruption
    interruptions: int
    ettr: float  # measured: productive / wall
    ettr_model_terms: float  # measured without the job's start and end (the model has neither)
    predicted: float | None  # Daly's goodput for the run's interval, checkpoint, MTBF and restart
    best_interval_s: float | None  # Daly's interval for the run's numbers
    best_predicted: float | None
    dominant: tuple[str, float] | None  # the lost kind that cost the most, with its seconds
    advice: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """As plain data."""
        return {k: (round(v, 6) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def run_model(acct: Account, timeline: Sequence[Mapping[str, Any]]) -> RunModel:
    """The run's measured ETTR beside what Daly's model predicts for its interval and MTBF, the
    cost that dominates and what would move it."""
    blocked = [float(e["blocked_s"]) for e in timeline if e.get("event") == "commit" and isinstance(e.get("blocked_s"), (int, float))]
    checkpoint_s = statistics.median(blocked) if blocked else None
    gaps = [seconds for seconds, _ in commit_gaps(timeline)]
    interval_s = max(0.0, statistics.median(gaps) - (checkpoint_s or 0.0)) if gaps else None
    failures = [i for i in acct.interruptions if i.kind != "cancelled"]
    mtbf_s = acct.wall_s / len(failures) if failures else None
    restart_s = statistics.mean(i.down_s for i in failures) if failures else None
    totals = acct.totals()
    wall = acct.wall_s
    ettr = totals["productive"] / wall if wall > 0 else 0.0
    in_terms = totals["productive"] / (wall - totals["overhead"]) if wall - totals["overhead"] > 0 else 0.0
    predicted = best_s = best = None
    if interval_s and mtbf_s and checkpoint_s and restart_s is not None:
        predicted = goodput(interval_s, checkpoint_s, mtbf_s, restart_s)
        plan = plan_interval(checkpoint_s, mtbf_s, restart_s)
        best_s, best = plan.interval_s, plan.goodput
    dominant = acct.dominant()
    model = RunModel(checkpoint_s, interval_s, mtbf_s, restart_s, len(failures), ettr, in_terms, predicted, best_s, best, dominant, ())
    return replace(model, advice=tuple(_advice(model, acct)))


def _advice(m: RunModel, acct: Account) -> list[str]:
    """What would move the ETTR, the dominant cost first."""
    said: list[str] = []
    totals = acct.totals()

    def each(kind: str) -> float:
        """The mean seconds of ``kind`` over the interruptions that had some."""
        had = [i.seconds[kind] for i in acct.interruptions if i.seconds.get(kind, 0) > 0]
        return sum(had) / len(had) if had else 0.0

    if m.best_interval_s is not None and m.interval_s and m.best_predicted is not None and m.predicted is not None:
        if abs(m.interval_s - m.best_interval_s) > 0.5 * m.best_interval_s:
            said.append(
                f"interval: checkpoint every {duration(m.best_interval_s)} of training instead of {duration(m.interval_s)} "
                f"(Daly's for a {m.checkpoint_s:.3g} s save, MTBF {duration(m.mtbf_s or 0)}, restart {duration(m.restart_s or 0)}): "
                f"predicted {m.best_predicted:.1%} instead of {m.predicted:.1%}"
            )
    hints = {
        "recompute": f"recompute ({duration(totals['recompute'])}, {acct.steps_recomputed} steps): the work since the last checkpoint is lost at "
        "each failure; checkpoint more often, which a fast tier makes cheap (CheckpointConfig(local_every=...): node-local copies)",
        "detection": f"detection ({duration(each('detection'))} a failure): lower the hang timeouts "
        "(ckpt run --timeout step=SECONDS; RUN_DIR/timeouts.json holds the calibrated ones)",
        "restart": f"restart ({duration(each('restart'))} a failure): keep spare processes warm (ckpt run --warm, the default), "
        "and hot spare nodes (ckpt submit --spares N) so that a failing node is replaced without a requeue",
        "queue": f"queue ({duration(each('queue'))} a requeue): hot spare nodes (ckpt submit --spares N) replace a node "
        "in the allocation instead of requeueing; `ckpt plan --nodes N --spares S ...` says what they buy",
        "load": f"load ({duration(each('load'))} a restart): a fast tier (CheckpointConfig(local_every=...)) loads "
        "from node-local copies instead of the shared file system",
        "checkpoint": f"checkpoint stalls ({duration(totals['checkpoint'])}"
        + (f", {m.checkpoint_s:.3g} s a save" if m.checkpoint_s is not None else "")
        + "): async saves (async_save=True) block only for the copy to memory; or checkpoint less often",
    }
    ranked = sorted(hints, key=lambda k: -totals[k])
    said += [hints[k] for k in ranked if totals[k] > 0][:3]
    return said
