"""The health ledger on disk: ``RUN_DIR/health.json`` and the end-of-round marker.

The ledger is folded (``core.node_ledger.fold_health``) from the run's events, which every node's
``ckpt run`` appends to the shared run directory; ``health.json`` is its latest fold, written
atomically for people and tools (``ckpt status`` folds the events itself). When one watchdog
finds a suspect node in its round it writes ``round_end.json``; every watchdog of the round
polls for it, so all nodes leave the round together and the batch script can act.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from ckpt_tool.core.node_ledger import DEFAULT_SUSPECT_AFTER, HealthLedger, fold_health
from ckpt_tool.supervise import run_dir as files
from ckpt_tool.supervise.run_dir import HEALTH_NAME, ROUND_END_NAME, read_events

__all__ = ["HEALTH_NAME", "ROUND_END_NAME", "RoundEnd", "RoundWatch", "end_round", "judge_round", "round_ended", "write_ledger"]


def node_name() -> str:
    """SLURM's name for this node (what NodeList and ExcNodeList take), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def round_id() -> str:
    """One id shared by every node's ``ckpt run`` of one ``srun`` step: job id, requeue count
    and step id. Outside SLURM each ``ckpt run`` is a round of its own."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if job and step:
        return f"{job}.{os.environ.get('SLURM_RESTART_COUNT', '0')}.{step}"
    return f"local-{uuid.uuid4().hex[:12]}"


def write_ledger(run_dir: Path, folded: HealthLedger, suspect_after: int = DEFAULT_SUSPECT_AFTER) -> None:
    """``health.json``: the ledger ``folded`` with its suspects at ``suspect_after`` failures."""
    files.write_health(run_dir, folded.to_json(suspect_after))


def judge_round(run_dir: Path, round_id: str, suspect_after: int) -> list[str]:
    """Fold the ledger, write it, and return the suspect nodes of round ``round_id``."""
    events = read_events(run_dir)
    folded = fold_health(events)
    try:
        write_ledger(run_dir, folded, suspect_after)
    except OSError:
        pass  # the ledger file is a convenience; the events hold the facts
    in_round = {e.get("node") for e in events if e.get("event") == "start" and e.get("round") == round_id}
    return [n for n in folded.suspects(suspect_after) if n in in_round]


@dataclass(frozen=True)
class RoundEnd:
    """How a round ended: the suspect nodes, and whether the ranks checkpoint before they stop."""

    suspects: list[str]
    checkpoint_first: bool  # a node suspect while training goes on: stop after a checkpoint, lose nothing


def end_round(run_dir: Path, round_id: str, suspects: list[str], by: str, checkpoint_first: bool = False) -> None:
    """Write the marker that ends round ``round_id`` on every node (``by``: this node)."""
    files.write_round_end(run_dir, round_id, suspects, by, checkpoint_first)


def round_ended(run_dir: Path, round_id: str) -> RoundEnd | None:
    """How another node's watchdog ended round ``round_id``, or None."""
    record = files.read_round_end(run_dir)
    if record is None or record.get("round") != round_id:
        return None
    return RoundEnd([str(n) for n in record.get("suspects") or []], record.get("checkpoint_first") is True)


@dataclass
class RoundWatch:
    """One node's part in its round's end: the suspect nodes once the round must end (this node's
    judgement or another node's marker), and whether it ends once the stop's checkpoint is
    committed (the ranks were still training, or had already stopped for it)."""

    run_dir: Path
    round_id: str
    node: str
    suspect_after: int = DEFAULT_SUSPECT_AFTER
    over: list[str] | None = None  # the suspect nodes, once this round must end
    after_stop: bool = False  # the round ends once the stop's checkpoint is committed
    checked: float = 0.0  # when the marker was last read

    def marker(self) -> RoundEnd | None:
        """Another node's marker, while the round is not known to be over."""
        return None if self.over is not None else round_ended(self.run_dir, self.round_id)

    def poll(self, now: float) -> RoundEnd | None:
        """``marker()``, at most once a second."""
        if now - self.checked <= 1.0:
            return None
        self.checked = now
        return self.marker()

    def judge(self, checkpoint_first: bool) -> RoundEnd | None:
        """Fold the ledger; when a node of this round is suspect, write the marker for every node."""
        suspects = judge_round(self.run_dir, self.round_id, self.suspect_after)
        if not suspects:
            return None
        end_round(self.run_dir, self.round_id, suspects, self.node, checkpoint_first)
        return RoundEnd(suspects, checkpoint_first)

    def take(self, ended: RoundEnd, ranks_stopped: bool, can_ask: bool) -> bool:
        """Record the round's end; True when the ranks must now be asked to checkpoint and stop
        (``can_ask``: they train and no stop was asked yet). Without a checkpoint first, or with
        no rank to ask, the round ends at once (``over`` without ``after_stop``)."""
        self.over = ended.suspects
        if ended.checkpoint_first and (ranks_stopped or can_ask):
            self.after_stop = True
            return not ranks_stopped
        return False
