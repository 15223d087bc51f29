"""One rank's watch over the values its training loop gives the checkpoint manager (``maybe_save(step,
metrics=...)``): the spike windows, the metrics record, and a replay's comparison with the first run.

The decisions are ``core.anomaly``'s; this holds the state between steps and does the I/O (the
run directory's ``metrics/rank_R.jsonl`` and ``anomaly.json``, through ``supervise.run_dir``). It
adds no collective: the manager carries a finding on the step's synchronising collective under
``ckpt run`` and gathers the findings only at a step that has one.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_tool.core.anomaly import FINGERPRINT, Anomaly, AnomalyPolicy, Difference, RankReplay, Verdict, detect, first_difference
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.supervise import run_dir as rd

log = logging.getLogger("ckpt_tool")


def as_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as plain floats (a tensor's ``.item()``; on a GPU that is a sync the loop's own
    logging usually pays already). A value that is not a number: ``CkptError`` (exit 2)."""
    out = {}
    for name, v in metrics.items():
        try:
            out[str(name)] = float(v.item() if hasattr(v, "item") else v)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise CkptError(
                f"metrics[{name!r}] is {type(v).__name__}, not a number ({exc})",
                "give maybe_save(step, metrics={...}) floats or one-element tensors, e.g. {'loss': loss.item()}",
                ExitCode.USAGE,
            ) from None
    return out


class AnomalyWatch:
    """``rank``'s values, checked each step against ``policy``; recorded under ``run_dir``.

    ``replay``: the run directory's ``anomaly.json`` when it says ``replaying`` (this start replays
    from a checkpoint up to its ``step``), read at construction; ``start(step)`` at the resume then
    loads the first run's values (the reference) and refills the spike windows from the record."""

    def __init__(self, run_dir: Path, rank: int, policy: AnomalyPolicy) -> None:
        self.run_dir, self.rank, self.policy = run_dir, rank, policy
        self.windows: dict[str, deque[float]] = {}
        self.record: rd.MetricsRecord | None = None
        try:
            self.last = rd.read_anomaly(run_dir)  # the previous anomaly (any status), or None
        except CkptError:
            self.last = None  # a newer ckpt-tool's file: no replay to continue
        self.replay = self.last if self.last is not None and self.last.get("status") == "replaying" else None
        self.reference: dict[int, dict[str, float]] = {}
        self.replayed: dict[int, dict[str, float]] = {}
        self.difference: Difference | None = None
        self._started = False
        self._no_record = False  # the record could not be opened: not tried again

    @property
    def replay_step(self) -> int | None:
        """The step a replay in progress ends at (its verdict), or None."""
        return int(self.replay["step"]) if self.replay is not None else None

    def start(self, resumed: int | None) -> None:
        """At the resume (``resumed``: the step loaded, None for a fresh start): the spike windows
        from the record, and a replay's reference (the first run's steps after ``resumed``)."""
        self._started = True
        if resumed is not None:
            for _, values in sorted(rd.recent_metrics(self.run_dir, self.rank, resumed - self.policy.window, resumed).items()):
                self._remember(values)
        if self.replay is not None:
            if resumed is None or resumed >= int(self.replay["step"]):
                log.warning(
                    "ckpt: anomaly.json asks for a replay up to step %s, but this start is at %s: no replay", self.replay["step"], resumed
                )
                self.replay = None
            else:
                self.reference = rd.recent_metrics(self.run_dir, self.rank, resumed, int(self.replay["step"]))

    def observe(self, step: int, values: Mapping[str, float]) -> Anomaly | None:
        """This step's values: recorded, then checked (during a replay: compared with the first run
        instead, the verdict comes at ``replay_step``). Returns this rank's finding, or None."""
        if not self._started:
            self.start(None)
        if self.record is None and not self._no_record:  # opened at the first values: a run that gives none writes nothing
            try:
                self.record = rd.MetricsRecord(self.run_dir, self.rank)
            except OSError as exc:
                self._no_record = True
                log.warning("ckpt: no metrics record (%s): wrong values are still found, a replay has no reference", exc)
        if self.record is not None:
            try:
                self.record.append(step, values)  # buffered: a full disk shows when the buffer goes out
            except OSError as exc:
                self._record_failed(exc)
        if self.replay is not None and step <= int(self.replay["step"]):
            self.replayed[step] = dict(values)
            if self.difference is None:
                self.difference = first_difference(self.reference, {step: values})
            self._remember(values)
            return None
        found = detect(self.rank, step, values, self.windows, self.policy)
        if found is None:
            self._remember(values)  # a wrong value stays out of the window it is judged by
        return found

    def replaying(self, step: int) -> bool:
        """Whether ``step`` is one of a replay's steps before its verdict (nothing is judged there)."""
        return self.replay is not None and step < int(self.replay["step"])

    def rank_replay(self) -> RankReplay:
        """What this rank brings to the replay's verdict."""
        return RankReplay(self.rank, self.difference, dict(self.reference))

    def begin_replay(self, step: int, from_step: int | None, found: list[Anomaly]) -> None:
        """Rank 0, before the ranks leave to replay: ``anomaly.json`` says ``replaying`` up to ``step``."""
        record = {"status": "replaying", "step": step, "from": from_step, "anomalies": [a.to_json() for a in found]}
        try:
            rd.write_anomaly(self.run_dir, record)
        except OSError as exc:
            raise CkptError(
                f"cannot write {self.run_dir / 'anomaly.json'} to replay the anomaly at step {step}: {exc}",
                "make the run directory writable; without it the restarted ranks would not know to replay",
            ) from None

    def replay_anomalies(self) -> list[Anomaly]:
        """The findings of the first run that this replay answers."""
        assert self.replay is not None
        return [Anomaly.from_json(a) for a in self.replay.get("anomalies", [])]

    def end_replay(self, verdict: Verdict, from_step: int | None, write: bool) -> None:
        """The verdict is in: detection again from the next step. The last anomaly is now ``done``,
        with the verdict and the checkpoint this replay started from (a second anomaly before the
        next checkpoint is not replayed again); ``write``: rank 0 writes it to ``anomaly.json``."""
        if self.replay is not None:
            record = {**self.replay, "status": "done", "from": from_step, **verdict.to_json()}
            if write:
                try:
                    rd.write_anomaly(self.run_dir, record)
                except OSError as exc:
                    log.warning("ckpt: cannot write the replay's verdict to %s: %s", self.run_dir, exc)
            self.last = record
        self.replay, self.reference, self.replayed = None, {}, {}

    def flush(self) -> None:
        """The record's buffered lines to the file system (at a save, before a replay, at the end)."""
        if self.record is not None:
            try:
                self.record.flush()
            except OSError as exc:
                self._record_failed(exc)

    def _record_failed(self, exc: OSError) -> None:
        """The record cannot be written (a full disk, a vanished directory): off, with a warning;
        wrong values are still found, a replay from here on has no reference."""
        assert self.record is not None
        log.warning("ckpt: metrics record %s: %s (turned off; wrong values are still found)", self.record.path, exc)
        try:
            self.record.close()
        except OSError:
            pass
        self.record, self._no_record = None, True

    def close(self) -> None:
        """Flush and close the record."""
        self.flush()
        if self.record is not None:
            try:
                self.record.close()
            except OSError as exc:
                log.warning("ckpt: metrics record %s: %s", self.record.path, exc)
            self.record = None

    def _remember(self, values: Mapping[str, float]) -> None:
        for name, v in values.items():
            if math.isfinite(v) and not name.startswith(FINGERPRINT):
                self.windows.setdefault(name, deque(maxlen=self.policy.window)).append(v)
