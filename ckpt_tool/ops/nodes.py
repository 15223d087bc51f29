"""``ckpt nodes``: the batch script asks which nodes to go on with; the answer is recorded.

The decision is ``core.node_ledger.plan_nodes`` over the ledger folded from the run's events; this
module adds the facts it needs from disk (the newest checkpoint) and records a replacement, a
shrink or an exclusion in the event log (``nodes_left_behind``, and one ``replaced`` per slot a
standby takes), where the ledger, ``ckpt status`` and ``ckpt history`` find it. The batch script only carries the plan out (``scontrol``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckpt_tool.core.node_ledger import (
    DEFAULT_SUSPECT_AFTER,
    LEAVE_EVENT,
    REPLACED_EVENT,
    NodePlan,
    Roster,
    fold_health,
    last_round_finished,
    plan_nodes,
)
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import newest_step
from ckpt_tool.supervise import round_end
from ckpt_tool.supervise.run_dir import note, read_events


def decide_nodes(
    ckpt_dir: Path,
    run_dir: Path,
    current: Sequence[str],
    min_nodes: int,
    after_failure: bool,
    suspect_after: int = DEFAULT_SUSPECT_AFTER,
    roster: Roster = Roster(),
) -> NodePlan:
    """The plan for a job on ``current`` nodes (``roster``: which of them train); a replacement,
    shrink or requeue is recorded in the events (a ``check`` records nothing: it asks again)."""
    for option, names in (("--nodes", current), ("--active", roster.active), ("--checked", roster.checked)):
        if (option == "--nodes" and not names) or any(not n or "," in n or n != n.strip() for n in names):
            raise CkptError(f"{option} {','.join(names)!r} is not a list of node names", "e.g. --nodes n1,n2,n3", ExitCode.USAGE)
    if min_nodes < 1 or suspect_after < 1 or (roster.train_nodes is not None and roster.train_nodes < 1):
        raise CkptError("--min-nodes, --suspect-after and --train-nodes must be >= 1", "see `ckpt nodes --help`", ExitCode.USAGE)
    events = read_events(run_dir)
    newest = newest_step(ckpt_dir)
    finished = last_round_finished(events) if after_failure else ()
    ledger = fold_health(events)
    plan = plan_nodes(tuple(current), ledger, min_nodes, newest, after_failure, suspect_after, finished, roster)
    if plan.drop and plan.action != "check":
        try:
            records = [
                note(
                    run_dir,
                    LEAVE_EVENT,
                    action=plan.action,
                    drop=list(plan.drop),
                    keep=list(plan.keep),
                    reason=plan.reason,
                    checkpoint=newest,
                )
            ]
            records += [
                note(
                    run_dir, REPLACED_EVENT, node=n, by=by, reason=ledger.record(n).why() if n in plan.drop else "gone from the allocation"
                )
                for n, by in plan.replaced
            ]
            round_end.write_ledger(run_dir, fold_health([*events, *records]), suspect_after)
        except OSError as exc:
            raise CkptError(
                f"cannot record the decision ({plan.action}: {plan.reason}) in {run_dir}: {exc.strerror or exc}",
                "a decision to leave nodes behind counts once it is recorded (the next ones read it back): run ckpt nodes on a "
                f"run directory you can write (--run-dir); to only look at the node ledger: ckpt status {run_dir}",
                ExitCode.USAGE,
            ) from None
    return plan
