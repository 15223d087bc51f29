"""Wrong numbers in the training: what counts as one, and what a replay from a checkpoint says
about it. Pure: values in, findings and verdicts out.

A rank gives the checkpoint manager its own values every step (``maybe_save(step,
metrics={"loss": ..., "grad_norm": ...})``). ``detect`` finds a NaN or an infinity, or a spike:
a value above ``median + k x MAD`` of the field's last ``window`` values (upward only: a loss or a
gradient norm that falls is training, not a fault; off until the window is full).

A finding sends every rank back to the newest checkpoint before it, to re-run the steps up to it
(resume is bit-identical, so a healthy machine computes the same bits again). ``first_difference``
compares a rank's replayed values with the first run's, bit for bit; ``judge_replay`` turns every
rank's comparison into a ``Verdict``:

- the replay differs: a **transient** fault (hardware: a GPU that computed a wrong value once). The
  rank(s) whose own values changed first are named: a field whose first-run value was the same on
  every rank (a global loss, an all-reduced gradient norm) changes on every rank and names nobody;
  a rank's local field (its loss before the all-reduce, its shard's gradient norm) names it. The
  replay is the correct trajectory: training goes on from it.
- the replay reproduces it: **reproducible**, the data or the model. A NaN or an infinity stops
  the run (a restart would train into it again), and so do replicas that part again (a code path
  that updates them differently: no checkpoint of it would mean one thing); a spike is reported
  and training goes on (or the user's hook decides).

The replica check (``compare_replicas``) finds ranks whose copies of a replicated parameter
differ; each rank also records a digest of its copies' fingerprints among its values of that step
(a field named ``FINGERPRINT...``), so the replay names the rank whose copy changed, even when no
loss shows it (a one-ulp change of an fp32 weight under fp16 autocast).

``plan_anomaly`` decides what a finding leads to under the run's mode (``replay``, ``stop``,
``warn``), with one bound: at most one replay per checkpoint interval (a second finding after a
replay from the same checkpoint stops with both reports). An **audit** (``audit_every``) is a
replay asked for with no wrong value: every N-th save, the steps since the previous checkpoint
are recomputed and compared before saving; the same bits everywhere is ``audited``, a rank that
computed other bits is a transient fault like any other (a corruption no spike shows).
"""

from __future__ import annotations

import math
import statistics
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MODES = ("replay", "stop", "warn")
# A recorded value whose name starts with this is a fingerprint (of the rank's replicas): compared
# bit for bit by a replay like any value, never judged as a number (no NaN, no spike).
FINGERPRINT = "fingerprint:"
MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution times this is its standard deviation


@dataclass(frozen=True)
class AnomalyPolicy:
    """When a value is wrong: NaN or infinite always; a spike above ``median + k x spread`` of the
    field's last ``window`` values, where spread is the MAD scaled to a standard deviation, at least
    ``min_rel_spread`` of the median's magnitude (a nearly constant series does not flag its noise).
    ``mode``: what a finding leads to (``MODES``)."""

    mode: str = "replay"
    window: int = 50
    k: float = 10.0
    min_rel_spread: float = 0.05

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"anomaly mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not isinstance(self.window, int) or self.window < 3:
            raise ValueError(f"anomaly window must be an integer >= 3 (values per field), got {self.window!r}")
        if not self.k > 0:
            raise ValueError(f"anomaly k (MAD multiples above the median) must be > 0, got {self.k!r}")
        if not self.min_rel_spread >= 0:
            raise ValueError(f"anomaly min_rel_spread must be >= 0, got {self.min_rel_spread!r}")

    def threshold(self, history: Sequence[float]) -> float | None:
        """The value above which the next one is a spike; None until ``window`` values are in."""
        if len(history) < self.window:
            return None
        recent = list(history)[-self.window :]
        median = statistics.median(recent)
        mad = statistics.median(abs(v - median) for v in recent)
        return median + self.k * max(MAD_TO_SIGMA * mad, self.min_rel_spread * abs(median))


Kind = Literal["nan", "inf", "spike", "replica", "audit"]


@dataclass(frozen=True)
class Anomaly:
    """A wrong value: ``rank``'s ``field`` at ``step`` was ``value`` (``kind``: nan, inf, spike above
    ``threshold``; ``replica``: its copy of the parameter ``field`` differs from its replicas', the
    fingerprints in ``value`` and ``threshold``: its own and the others'; ``audit``: no wrong value,
    the steps up to ``step`` are to be recomputed and compared, ``CheckpointConfig.audit_every``)."""

    rank: int
    step: int
    field: str
    value: float
    kind: Kind
    threshold: float | None = None

    def describe(self) -> str:
        """One line: which rank, which field, what value, against what."""
        what = {"nan": "NaN", "inf": "infinite"}.get(self.kind)
        if self.kind == "audit":
            return f"audit of the steps up to {self.step}"
        if self.kind == "replica":
            return f"rank {self.rank}: its replica of {self.field} differs from the other ranks' copies after step {self.step}"
        if what is not None:
            return f"rank {self.rank}: {self.field} is {what} at step {self.step}"
        return f"rank {self.rank}: {self.field} spiked to {self.value:.6g} at step {self.step} (threshold {self.threshold:.6g})"

    def to_json(self) -> dict[str, Any]:
        """The anomaly as a JSON-able dict (non-finite values as strings: JSON has no NaN)."""
        return {
            "rank": self.rank, "step": self.step, "field": self.field, "value": _num(self.value), "kind": self.kind,
            "threshold": None if self.threshold is None else _num(self.threshold),
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Anomaly:
        """The inverse of ``to_json``."""
        t = d.get("threshold")
        return cls(int(d["rank"]), int(d["step"]), str(d["field"]), float(d["value"]), d["kind"], None if t is None else float(t))


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else repr(v)


def detect(
    rank: int, step: int, values: Mapping[str, float], history: Mapping[str, Sequence[float]], policy: AnomalyPolicy
) -> Anomaly | None:
    """The first wrong value among ``values`` (fields in order): NaN or infinite, else above the
    policy's threshold over the field's ``history`` (the values before this step). None: all fine.
    Fingerprints (``FINGERPRINT``) are not numbers to judge."""
    values = {k: v for k, v in values.items() if not k.startswith(FINGERPRINT)}
    for name, v in values.items():
        if math.isnan(v):
            return Anomaly(rank, step, name, v, "nan")
        if math.isinf(v):
            return Anomaly(rank, step, name, v, "inf")
    for name, v in values.items():
        limit = policy.threshold(history.get(name, ()))
        if limit is not None and v > limit:
            return Anomaly(rank, step, name, v, "spike", limit)
    return None


def compare_replicas(
    step: int, names: Sequence[str], keys: Sequence[Sequence[tuple[int, ...]]], prints: Sequence[Sequence[int]]
) -> list[Anomaly]:
    """The ranks whose copy of a replicated parameter differs from its replicas' (``training.replicas``).

    ``names``: the replicated parameters, the same on every rank; ``keys[r][i]``, ``prints[r][i]``:
    rank r's replica key and fingerprint of parameter i (ranks with equal keys hold the same bytes).
    In each group, the ranks outside the largest set of equal fingerprints are named; with no
    majority (two replicas that differ) every rank of the group is, since nothing tells which copy
    is right (the replay does). One finding per rank, its first differing parameter."""
    found: dict[int, Anomaly] = {}
    for i, name in enumerate(names):
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(len(prints)):
            groups.setdefault(tuple(keys[rank][i]), []).append(rank)
        for ranks in groups.values():
            counts: dict[int, int] = {}
            for r in ranks:
                counts[prints[r][i]] = counts.get(prints[r][i], 0) + 1
            if len(counts) < 2:
                continue
            top = max(counts.values())
            majority = [v for v, c in counts.items() if c == top]
            right = majority[0] if len(majority) == 1 else None
            for r in ranks:
                if r not in found and (right is None or prints[r][i] != right):
                    others = next((prints[o][i] for o in ranks if prints[o][i] != prints[r][i]), 0)
                    found[r] = Anomaly(r, step, name, float(prints[r][i]), "replica", float(others))
    return [found[r] for r in sorted(found)]


def same_bits(a: float, b: float) -> bool:
    """Bit-for-bit equal as float64 (0.0 is not -0.0); any NaN equals any NaN: the record is JSON,
    which keeps neither a NaN's sign nor its payload, so a NaN computed again is the same NaN."""
    if math.isnan(a) and math.isnan(b):
        return True
    return struct.pack("<d", a) == struct.pack("<d", b)


@dataclass(frozen=True)
class Difference:
    """A rank's first replayed step whose values are not the first run's: each differing field's
    (recorded, replayed) values; a field missing on one side counts as differing (NaN for it)."""

    step: int
    fields: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def describe(self) -> str:
        """``field recorded -> replayed`` for each differing field."""
        return ", ".join(f"{k} {r!r} -> {p!r}" for k, (r, p) in sorted(self.fields.items()))


def first_difference(recorded: Mapping[int, Mapping[str, float]], replayed: Mapping[int, Mapping[str, float]]) -> Difference | None:
    """The first step (of those replayed) whose values differ from the record, bit for bit; None
    when every replayed step matches. A step the record lacks is not compared (nothing to compare)."""
    for step in sorted(replayed):
        if step not in recorded:
            continue
        was, now = recorded[step], replayed[step]
        fields = {
            k: (float(was.get(k, math.nan)), float(now.get(k, math.nan)))
            for k in sorted(set(was) | set(now))
            if k not in was or k not in now or not same_bits(float(was[k]), float(now[k]))
        }
        if fields:
            return Difference(step, fields)
    return None


@dataclass(frozen=True)
class RankReplay:
    """What one rank brings to the verdict: its first difference (None: identical), and its
    recorded values at that step (to tell its own fields from the ones every rank shares)."""

    rank: int
    difference: Difference | None
    recorded_at: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # step -> the first run's values


@dataclass(frozen=True)
class Verdict:
    """What a replay says: ``transient`` (the replay differs: ``ranks`` the ones whose own values
    changed first, at ``differs_at``; empty when only values every rank shares changed) or
    ``reproducible`` (the same bits again). ``action``: ``continue`` or ``stop``."""

    kind: Literal["transient", "reproducible", "audited"]
    anomalies: tuple[Anomaly, ...]
    ranks: tuple[int, ...] = ()
    differs_at: int | None = None
    fields: Mapping[int, str] = field(default_factory=dict)  # rank -> its differences, described
    action: Literal["continue", "stop"] = "continue"

    def message(self) -> str:
        """The verdict in words, for the event log and the user."""
        first = "; ".join(a.describe() for a in self.anomalies)
        if self.kind == "audited":
            return f"audit passed: the steps up to {self.step} recomputed from the checkpoint, the same bits on every rank"
        if self.kind == "transient":
            who = (
                ", ".join(f"rank {r} ({self.fields.get(r, '')})" for r in self.ranks)
                if self.ranks
                else "no single rank (only values every rank shares changed)"
            )
            return (
                f"transient fault: the replay differs from the first run at step {self.differs_at}: {who}. "
                f"What the first run found ({first}) was a hardware fault, not the data; training goes on from the replay"
            )
        if self.action == "stop":
            return (
                f"reproducible: the replay computed the same bits ({first}): the data or the model, not the hardware; "
                "stopped (a restart would train into it again)"
            )
        return f"reproducible: the replay computed the same bits ({first}): the data or the model; training goes on"

    @property
    def step(self) -> int | None:
        """The step of the wrong value the replay answers (the first, when several)."""
        return min((a.step for a in self.anomalies), default=None)

    def to_json(self) -> dict[str, Any]:
        """The verdict as a JSON-able dict."""
        return {
            "verdict": self.kind, "ranks": list(self.ranks), "step": self.step, "differs_at": self.differs_at, "action": self.action,
            "differences": {str(r): d for r, d in self.fields.items()}, "anomalies": [a.to_json() for a in self.anomalies],
            "message": self.message(),
        }  # fmt: skip


def _shared(field_name: str, step: int, replays: Sequence[RankReplay]) -> bool:
    """Whether every rank recorded the same bits for ``field_name`` at ``step`` (a global value)."""
    values = [r.recorded_at.get(step, {}).get(field_name) for r in replays]
    if len(values) < 2 or any(v is None for v in values):
        return False
    return all(same_bits(float(v), float(values[0])) for v in values)  # type: ignore[arg-type]


def judge_replay(anomalies: Sequence[Anomaly], replays: Sequence[RankReplay]) -> Verdict:
    """The verdict from every rank's comparison of its replay with the first run (see the module)."""
    found = tuple(anomalies)
    differing = [r for r in replays if r.difference is not None]
    if not differing and found and all(a.kind == "audit" for a in found):
        return Verdict("audited", found)  # recomputed, the same bits on every rank
    if not differing:  # a NaN again, or replicas that part again: a restart would train into it
        stop = any(a.kind in ("nan", "inf", "replica") for a in found)
        return Verdict("reproducible", found, action="stop" if stop else "continue")
    step = min(r.difference.step for r in differing if r.difference is not None)
    first = [r for r in differing if r.difference is not None and r.difference.step == step]
    own = [
        r for r in first if r.difference is not None and any(not _shared(f, step, replays) for f in r.difference.fields)
    ] if len(replays) > 1 else first  # fmt: skip
    return Verdict(
        "transient", found, tuple(sorted(r.rank for r in own)), step,
        {r.rank: r.difference.describe() for r in own if r.difference is not None},
    )  # fmt: skip


@dataclass(frozen=True)
class AnomalyAction:
    """What a finding leads to: ``replay`` (back to ``from_step``), ``stop`` or ``warn``; ``why`` in words."""

    action: Literal["replay", "stop", "warn"]
    why: str
    from_step: int | None = None


def plan_anomaly(
    mode: str, anomalies: Sequence[Anomaly], *, supervised: bool, checkpoint: int | None, replayed_from: int | None
) -> AnomalyAction:
    """What to do about ``anomalies`` (every rank's findings of one step) under ``mode``.

    ``checkpoint``: the newest checkpoint (the replay's start); ``replayed_from``: the checkpoint
    the last replay started from (None: none yet). A replay needs ``ckpt run`` (``supervised``: it
    restarts the ranks) and a checkpoint to go back to; a second finding after a replay from the
    same checkpoint is not replayed again (one replay per checkpoint interval)."""
    found = "; ".join(a.describe() for a in anomalies)
    if anomalies and all(a.kind == "audit" for a in anomalies):  # asked for: the mode is about wrong values
        if not supervised or checkpoint is None or replayed_from == checkpoint:
            why = (
                "needs ckpt run" if not supervised else "no checkpoint yet" if checkpoint is None else "this interval was replayed already"
            )
            return AnomalyAction("warn", f"{found} skipped ({why})")
        return AnomalyAction("replay", f"{found}: recomputing them from checkpoint {checkpoint}", checkpoint)
    if mode == "warn":
        return AnomalyAction("warn", f"{found} (anomaly mode warn: training goes on)")
    if mode == "stop":
        return AnomalyAction("stop", f"{found} (anomaly mode stop)")
    if not supervised:
        return AnomalyAction("stop", f"{found}; a replay needs ckpt run (it restarts the ranks from the checkpoint): stopped")
    if checkpoint is None:
        return AnomalyAction("stop", f"{found}; no checkpoint yet to replay from: stopped")
    if replayed_from is not None and replayed_from == checkpoint:
        return AnomalyAction(
            "stop", f"{found}; a second anomaly after a replay from checkpoint {checkpoint} (one replay per checkpoint interval): stopped"
        )
    return AnomalyAction("replay", f"{found}: replaying from checkpoint {checkpoint} to tell a hardware fault from the data", checkpoint)


@dataclass(frozen=True)
class RecordComparison:
    """``ckpt replay``'s verdict: steps ``first``..``last`` replayed against the run's record of
    every rank. ``difference``: the first (step, rank) whose values differ and how (None: every
    compared step equal, bit for bit); ``unrecorded``: replayed steps the record lacks for some rank."""

    first: int
    last: int
    ranks: int
    compared: tuple[int, ...]
    difference: tuple[int, Difference] | None = None  # (rank, its first difference)
    unrecorded: tuple[int, ...] = ()

    @property
    def identical(self) -> bool:
        """Every replayed step was recorded and equals the record, bit for bit."""
        return self.difference is None and not self.unrecorded and len(self.compared) == self.last - self.first + 1

    def message(self) -> str:
        """The verdict in words."""
        span = f"steps {self.first}..{self.last}" if self.last > self.first else f"step {self.first}"
        if self.difference is not None:
            rank, d = self.difference
            return f"{span} replayed: step {d.step} differs from the record on rank {rank}: {d.describe()}"
        if not self.compared:
            return f"{span} replayed, but the run recorded no values for them: nothing to compare (the training gives none to maybe_save(metrics=...)?)"
        if self.unrecorded:
            return (
                f"{span} replayed: {len(self.compared)} bit-identical to the record; not recorded: {', '.join(map(str, self.unrecorded))}"
            )
        return f"{span} bit-identical to the record ({self.ranks} ranks, every value)"

    def to_json(self) -> dict[str, Any]:
        """The comparison as a JSON-able dict."""
        diff = None
        if self.difference is not None:
            rank, d = self.difference
            diff = {"step": d.step, "rank": rank, "fields": {k: [_num(a), _num(b)] for k, (a, b) in d.fields.items()}}
        return {
            "first": self.first, "last": self.last, "ranks": self.ranks, "identical": self.identical, "compared": list(self.compared),
            "unrecorded": list(self.unrecorded), "difference": diff, "message": self.message(),
        }  # fmt: skip


def compare_records(
    recorded: Mapping[int, Mapping[int, Mapping[str, float]]],
    replayed: Mapping[int, Mapping[int, Mapping[str, float]]],
    first: int,
    last: int,
) -> RecordComparison:
    """Each rank's replayed values of steps ``first``..``last`` against the run's record
    (``rank -> step -> values``): the first differing step (the lowest rank at it) is the verdict."""
    steps = range(first, last + 1)
    unrecorded = tuple(s for s in steps if any(s in replayed.get(r, {}) and s not in recorded.get(r, {}) for r in replayed))
    compared = tuple(s for s in steps if s not in unrecorded and all(s in replayed.get(r, {}) for r in replayed) and replayed)
    found: tuple[int, Difference] | None = None
    for rank in sorted(replayed):
        d = first_difference(recorded.get(rank, {}), {s: v for s, v in replayed[rank].items() if first <= s <= last})
        if d is not None and (found is None or d.step < found[1].step):
            found = (rank, d)
    return RecordComparison(first, last, len(replayed), compared, found, unrecorded)
