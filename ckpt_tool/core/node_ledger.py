"""Which node is to blame, and what to do about it. Pure: events in, a ledger and a plan out.

Every failure `ckpt run` sees is a *failure group*: the rank exits and hangs of one torchrun
attempt of one round (one ``srun`` step: ``round`` = job id, requeue count, step id), logged by
the watchdog of each node with the node's name. A rank's exit has a cause:

- ``crashed``: an exception of its own (``classify_crash`` says it is not a collective failing
  because a peer died), ``killed``: it vanished without a word (SIGKILL, a segfault, the OOM
  killer), ``hung``: the watchdog's culprit of a hang. These *blame* the rank's node;
- ``corrupted``: the rank computed a value its replay from the checkpoint does not reproduce
  (``silent_fault``: a transient hardware fault, ``core.anomaly``). It blames the rank's node too;
  a rank that left to replay (cause ``replay``) is nobody's failure;
- ``peer_failure``: a collective failed because a peer went away (gloo "connection closed by
  peer", NCCL aborts), ``terminated``: torchrun stopped it because another rank failed. These
  are victims, not culprits.

The ledger folds the groups in order: a group that blames some nodes of the round while other
nodes of the round were fine adds one failure *in a row* to each blamed node and resets the
others; a group that blames every node (a bug in the code fails everywhere) or none is
*unattributed* and resets everybody. A node blamed ``suspect_after`` times in a row is suspect.

Two more entries need no failure: a GPU hardware error (``gpu_error``: an uncorrectable ECC
error, a critical XID) makes its node suspect at once; a ``straggler`` is counted, and makes its
node suspect only when the run asked for it (``ckpt run --straggler-suspect``: the event then
says ``suspect``). A one-node job is then requeued on another node (ExcNodeList).

A standby that fails its pre-flight check (``node_check`` with ``result=failed``, the chain's
``--node-check`` command) is flagged the same way: it never takes a slot.

``plan_nodes`` turns the ledger into one action for the batch script: ``continue``, ``replace``
(hot spares: a standby of the allocation takes each suspect's slot, the same node count and world
size; the suspect is given back with scontrol update NodeList=keep), ``shrink`` (no standby left:
go on with fewer nodes), ``requeue`` (with ExcNodeList), ``check`` (run the pre-flight check on
the standbys about to take a slot, then ask again) or ``stop`` (the failure is not a node's: the
crash-loop breaker's business). One guard keeps a code bug from eating the allocation: after
nodes were left behind or replaced, no more are until a new checkpoint was committed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

BLAMING_CAUSES = frozenset({"crashed", "killed", "hung", "corrupted"})
VICTIM_CAUSES = frozenset({"peer_failure", "terminated"})
DEFAULT_SUSPECT_AFTER = 2
LEAVE_EVENT = "nodes_left_behind"  # logged by `ckpt nodes` when it tells the script to shrink, replace or requeue
REPLACED_EVENT = "replaced"  # logged by `ckpt nodes`, one per suspect a standby replaces
ACTIVE_EVENT = "nodes_active"  # logged by `ckpt job` as a round starts: which nodes run ranks, which stand by
CHECK_EVENT = "node_check"  # logged by `ckpt job`: a node's pre-flight check (--node-check), passed or failed

# A collective that failed because a peer went away: not this rank's fault.
_PEER_ERROR_TYPES = {"DistBackendError", "DistNetworkError", "DistStoreError"}
_PEER_MESSAGES = re.compile(
    r"connection closed by peer|connection reset by peer|remote worker crash|broken pipe|"
    r"nccl communicator was aborted|ncclremoteerror|watchdog caught collective operation timeout|"
    r"gloo/transport|socket timeout|connection refused",
    re.IGNORECASE,
)


def classify_crash(error_type: str, message: str) -> Literal["crashed", "peer_failure"]:
    """``peer_failure`` for a collective that failed because another rank went away (the
    error names the transport or the peer), else ``crashed``: this rank's own failure."""
    if error_type.rsplit(".", 1)[-1] in _PEER_ERROR_TYPES or _PEER_MESSAGES.search(message or ""):
        return "peer_failure"
    return "crashed"


@dataclass(frozen=True)
class NodeRecord:
    """One node's line in the ledger: its failures (in a row and in all), stragglers, flags, and
    whether the job left it behind."""

    node: str
    in_a_row: int = 0  # failures blamed on this node with no failure elsewhere in between
    total: int = 0
    last_reason: str = ""
    last_time: float | None = None
    left_behind: str | None = None  # why the job left it behind, when it did
    stragglers: int = 0  # straggler reports of its ranks
    last_straggler: str = ""
    flagged: str | None = None  # suspect without failing: a GPU hardware error, a straggler (when asked)

    def suspect(self, suspect_after: int) -> bool:
        """True once ``suspect_after`` failures in a row are blamed on the node, or it was flagged."""
        return self.in_a_row >= suspect_after or self.flagged is not None

    def why(self) -> str:
        """Why the node is suspect, in words for a log or ``ckpt nodes``."""
        failures = f"{self.in_a_row} failures in a row, last {self.last_reason}"
        return failures if self.flagged is None else f"{self.flagged}" + (f"; {failures}" if self.in_a_row else "")

    def to_json(self) -> dict[str, Any]:
        """The record as ``health.json`` and ``ckpt status --json`` hold it."""
        return {
            "node": self.node,
            "failures_in_a_row": self.in_a_row,
            "failures_total": self.total,
            "last_reason": self.last_reason,
            "last_time": self.last_time,
            "left_behind": self.left_behind,
            "stragglers": self.stragglers,
            "last_straggler": self.last_straggler,
            "flagged": self.flagged,
        }


@dataclass(frozen=True)
class HealthLedger:
    """Every node's record folded from a run's events (``fold_health``), and how many failure groups
    could be blamed on some nodes and how many could not."""

    nodes: tuple[NodeRecord, ...] = ()
    attributed: int = 0  # failure groups blamed on some nodes of their round
    unattributed: int = 0  # failure groups blamed on every node, or on none
    leave_checkpoint: int | None = None  # the newest checkpoint when nodes were last left behind
    left_any: bool = False
    active: tuple[str, ...] = ()  # the nodes that ran ranks in the newest round (ACTIVE_EVENT)
    standby: tuple[str, ...] = ()  # the allocation's standbys then: no ranks, ready to take a slot
    replaced: tuple[tuple[str, str, str], ...] = ()  # (node, standby that took its slot, why), oldest first

    def record(self, node: str) -> NodeRecord:
        """The record of ``node``: an empty one when nothing was blamed on it."""
        return next((r for r in self.nodes if r.node == node), NodeRecord(node))

    def suspects(self, suspect_after: int = DEFAULT_SUSPECT_AFTER) -> tuple[str, ...]:
        """The nodes to suspect at ``suspect_after`` failures in a row, in ledger order."""
        return tuple(r.node for r in self.nodes if r.suspect(suspect_after))

    def left_behind(self) -> tuple[str, ...]:
        """The nodes a ``ckpt nodes`` shrink or requeue already left behind."""
        return tuple(r.node for r in self.nodes if r.left_behind)

    def to_json(self, suspect_after: int = DEFAULT_SUSPECT_AFTER) -> dict[str, Any]:
        """The ledger as ``health.json`` holds it, its suspects counted at ``suspect_after``."""
        return {
            "nodes": [r.to_json() for r in self.nodes],
            "suspects": list(self.suspects(suspect_after)),
            "left_behind": list(self.left_behind()),
            "suspect_after": suspect_after,
            "failures_attributed": self.attributed,
            "failures_unattributed": self.unattributed,
            "active": list(self.active),
            "standby": list(self.standby),
            "replaced": [{"node": n, "by": by, "reason": why} for n, by, why in self.replaced],
        }


@dataclass
class _Group:
    blamed: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # node -> (cause, reason, time)

    def culprits(self) -> dict[str, tuple[str, str, float]]:
        """A rank that vanished without a word next to one that raised an error of its own was
        most likely torn down (by its agent, before it could say so): the error is the culprit."""
        spoke = {n: b for n, b in self.blamed.items() if b[0] != "killed"}
        return spoke or self.blamed


def _blame(e: Mapping[str, Any]) -> tuple[str, str] | None:
    """(cause, reason) when an event blames its node, else None."""
    if e.get("event") == "rank_exited" and e.get("cause") in BLAMING_CAUSES:
        return str(e["cause"]), f"rank {e.get('rank')} (local {e.get('local_rank')}) {e.get('cause')}: {e.get('reason', '')}".rstrip(": ")
    if e.get("event") == "silent_fault":
        return (
            "corrupted",
            f"rank {e.get('rank')} computed a value its replay does not reproduce at step {e.get('step')}: {e.get('differences', '')}",
        )
    if e.get("event") == "hang" and e.get("culprit"):
        return "hung", f"rank {e.get('rank')} (local {e.get('local_rank')}) hung in {e.get('phase')} at step {e.get('step')}"
    return None


def _number(value: Any, kind: type) -> Any:
    if value is None:
        return kind(0)
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def fold_health(events: Iterable[Mapping[str, Any]]) -> HealthLedger:
    """The ledger of a run from its events (``events.jsonl``), oldest first."""
    round_nodes: dict[str, set[str]] = {}
    round_end: dict[str, float] = {}  # exits after a round was ended are the watchdogs' own doing
    groups: dict[tuple[str, int], _Group] = {}
    order: list[tuple[str, Any]] = []  # ("group", key) or ("leave", event), in log order
    roster: dict[str, Any] = {}
    for e in events:
        node, rnd = e.get("node"), e.get("round")
        if e.get("event") in (ACTIVE_EVENT, REPLACED_EVENT):
            _roster(roster, e)
            continue
        if e.get("event") == LEAVE_EVENT or (e.get("event") in _MARKS and isinstance(node, str)):
            order.append(("mark" if e.get("event") in _MARKS else "leave", e))
            continue
        if not isinstance(node, str) or not isinstance(rnd, str):
            continue
        when, attempt = _number(e.get("time"), float), _number(e.get("attempt"), int)
        if when is None or attempt is None:
            continue  # not an event this module wrote: no evidence
        if e.get("event") == "start":
            round_nodes.setdefault(rnd, set()).add(node)
            continue
        if e.get("event") == "round_ended":
            round_end.setdefault(rnd, when)
            continue
        blame = _blame(e)
        if (blame is None and e.get("event") != "rank_exited") or when > round_end.get(rnd, float("inf")):
            continue
        key = (rnd, attempt)
        if key not in groups:
            groups[key] = _Group()
            order.append(("group", key))
        if blame is not None and (node not in groups[key].blamed or groups[key].blamed[node][0] == "killed"):
            groups[key].blamed[node] = (*blame, when)
    records: dict[str, NodeRecord] = {}
    ledger = HealthLedger()
    for kind, item in order:
        if kind == "mark":
            records[item["node"]] = _marked(records.get(item["node"], NodeRecord(item["node"])), item)
            continue
        if kind == "leave":
            left = [str(n) for n in item.get("drop") or []]
            for n in left:
                records[n] = replace(records.get(n, NodeRecord(n)), left_behind=str(item.get("reason", "left behind")))
            ckpt = item.get("checkpoint")
            ledger = replace(ledger, leave_checkpoint=ckpt if isinstance(ckpt, int) else None, left_any=ledger.left_any or bool(left))
            continue
        culprits = groups[item].culprits()
        nodes = round_nodes.get(item[0], set()) | set(culprits)
        for n in nodes:
            records.setdefault(n, NodeRecord(n))
        if not culprits:
            continue  # only victims seen: nothing to learn
        if len(nodes) < 2 or set(culprits) >= nodes:  # everywhere (or one node, nobody to compare with)
            ledger = replace(ledger, unattributed=ledger.unattributed + 1)
            for n in nodes:
                r = records[n]
                records[n] = replace(r, in_a_row=0, total=r.total + (n in culprits))
            continue
        ledger = replace(ledger, attributed=ledger.attributed + 1)
        for n in nodes:
            r = records[n]
            if n in culprits:
                _, reason, when = culprits[n]
                records[n] = replace(r, in_a_row=r.in_a_row + 1, total=r.total + 1, last_reason=reason, last_time=when)
            else:
                records[n] = replace(r, in_a_row=0)
    return replace(ledger, nodes=tuple(records[n] for n in sorted(records)), **roster)


def _names(value: Any) -> tuple[str, ...]:
    """A node list as an event holds it: a JSON list, or the chain's comma string (- for none)."""
    if isinstance(value, list):
        return tuple(str(n) for n in value)
    return tuple(n for n in str(value or "").split(",") if n and n != "-")


def _roster(roster: dict[str, Any], e: Mapping[str, Any]) -> None:
    """The newest round's active and standby nodes, and every replacement, from their events."""
    if e.get("event") == ACTIVE_EVENT:
        roster["active"], roster["standby"] = _names(e.get("active")), _names(e.get("standby"))
    elif e.get("node") and e.get("by"):
        roster["replaced"] = (*roster.get("replaced", ()), (str(e["node"]), str(e["by"]), str(e.get("reason", ""))))


_MARKS = frozenset({"straggler", "slow_link", "gpu_error", CHECK_EVENT})


def _marked(r: NodeRecord, e: Mapping[str, Any]) -> NodeRecord:
    """A ``straggler``, ``slow_link``, ``gpu_error`` or ``node_check`` event's entry in its node's record."""
    if e.get("event") == CHECK_EVENT:
        if e.get("result") != "failed":
            return r
        return replace(r, flagged=f"node check failed ({e.get('detail') or 'exit ' + str(e.get('exit_code'))})")
    if e.get("event") == "gpu_error":
        xids = ", ".join(str(x) for x in e.get("xids") or [])
        what = f"XID {xids}" if xids else f"{e.get('ecc_uncorrected_new')} uncorrectable ECC error(s)"
        return replace(r, flagged=f"GPU {e.get('gpu')} (rank {e.get('rank')}): {what}")
    if e.get("event") == "slow_link":
        reason = f"slow link: {e.get('share')} of the other links' rate"
    else:
        reason = f"rank {e.get('rank')} {e.get('phase')} {e.get('slower_x')}x its peers' median at step {e.get('step')}"
    return replace(r, stragglers=r.stragglers + 1, last_straggler=reason, flagged=f"straggler: {reason}" if e.get("suspect") else r.flagged)


def last_round_finished(events: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The nodes whose ``ckpt run`` finished the training in the last round, when none of that
    round failed or stopped: srun then reports the exit of a node lost during the round (killed
    with its agent, left out by torchrun's elastic rendezvous), but the training is done."""
    starts = [e for e in events if e.get("event") == "start" and isinstance(e.get("round"), str)]
    if not starts:
        return ()
    rnd = starts[-1]["round"]
    ends = [e for e in events if e.get("round") == rnd and e.get("event") in _ROUND_ENDS]
    if not ends or any(e["event"] != "finished" for e in ends):
        return ()
    return tuple(sorted({str(e.get("node")) for e in ends}))


_ROUND_ENDS = frozenset({"finished", "failed", "crash_loop", "fatal", "round_ended", "stopped_for_requeue", "stop_deadline"})

Action = Literal["continue", "replace", "shrink", "requeue", "check", "stop", "finished"]


@dataclass(frozen=True)
class NodePlan:
    """What the batch script does next: ``keep`` the nodes to go on with (the allocation after the
    give-back), ``drop`` the nodes to give back now, ``exclude`` every node the job must not land on
    again (for ExcNodeList), ``active`` the nodes of ``keep`` that run ranks in the next round (the
    rest stand by), ``check`` the standbys to pre-flight before this plan holds (action ``check``),
    ``replaced`` (suspect, standby) for each slot a standby takes."""

    action: Action
    keep: tuple[str, ...]
    drop: tuple[str, ...]
    exclude: tuple[str, ...]
    reason: str
    active: tuple[str, ...] = ()
    check: tuple[str, ...] = ()
    replaced: tuple[tuple[str, str], ...] = ()

    @property
    def standby(self) -> tuple[str, ...]:
        """The nodes kept without ranks: hot spares for the next suspect."""
        return tuple(n for n in self.keep if n not in self.active)

    def script_fields(self) -> tuple[str, str, str, str, str, str, str]:
        """The plan as ``ckpt nodes --for-script`` prints it: ACTION KEEP DROP EXCLUDE ACTIVE CHECK
        REPLACED, comma lists (``-`` for none), REPLACED as ``suspect:standby`` pairs."""
        lists = (self.keep, self.drop, self.exclude, self.active, self.check, tuple(f"{n}:{by}" for n, by in self.replaced))
        keep, drop, exclude, active, check, replaced = (",".join(x) or "-" for x in lists)
        return self.action, keep, drop, exclude, active, check, replaced

    def to_json(self) -> dict[str, Any]:
        """The plan as ``ckpt nodes --json`` prints it for the batch script."""
        return {
            "action": self.action,
            "keep": list(self.keep),
            "drop": list(self.drop),
            "exclude": list(self.exclude),
            "active": list(self.active),
            "standby": list(self.standby),
            "check": list(self.check),
            "replaced": [{"node": n, "by": by} for n, by in self.replaced],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Roster:
    """Which of the allocation's nodes run ranks: ``train_nodes`` of them (None: all), ``active`` the
    ones that ran the last round (empty at a job's start: the first ``train_nodes`` in SLURM's order),
    ``node_check`` whether a standby is pre-flighted before it takes a slot, ``checked`` the nodes
    whose check passed for the decision under way."""

    train_nodes: int | None = None
    active: tuple[str, ...] = ()
    node_check: bool = False
    checked: tuple[str, ...] = ()


def plan_nodes(
    current: Sequence[str],
    ledger: HealthLedger,
    min_nodes: int,
    newest_checkpoint: int | None,
    after_failure: bool,
    suspect_after: int = DEFAULT_SUSPECT_AFTER,
    finished: Sequence[str] = (),
    roster: Roster = Roster(),
) -> NodePlan:
    """The next action for a job on ``current`` nodes (the whole allocation, standbys included).

    At a job's start (``after_failure`` False) nodes left behind before (or suspect) are dropped
    again: SLURM may hand them back when ExcNodeList could not be set. After a failed round, the
    suspects are dropped; when none is suspect the failure is not a node's and the job stops.
    Each dropped active node's slot goes to a standby (``replace``: the healthy active nodes keep
    their order, the standbys follow in SLURM's order); only with no standby left does the job go
    on with fewer nodes (``shrink``), and with fewer than ``min_nodes`` it requeues excluding every
    bad node. ``finished``: the nodes that finished the training in the failed round
    (``last_round_finished``): then srun only reported a node lost on the way, and the job is done.
    """
    suspects = set(ledger.suspects(suspect_after))
    exclude = tuple(sorted(set(ledger.left_behind()) | suspects))
    if after_failure and finished:
        return NodePlan(
            "finished",
            tuple(finished),
            (),
            ledger.left_behind(),
            f"the training finished on {', '.join(finished)}; srun reported the exit of a node lost during the round",
            active=tuple(finished),
        )
    bad = suspects | set(ledger.left_behind()) if not after_failure else suspects
    drop = tuple(n for n in current if n in bad)
    keep = tuple(n for n in current if n not in bad)
    want = min(roster.train_nodes or len(current), len(current))
    before = roster.active or tuple(current[:want])
    stays = tuple(n for n in before if n in keep)
    standbys = tuple(n for n in keep if n not in stays)
    takes = standbys[: max(0, want - len(stays))]
    active = stays + takes
    if not drop:
        if not after_failure:
            return NodePlan("continue", keep, (), exclude, "no node of this allocation is suspect", active=active)
        return NodePlan(
            "stop",
            keep,
            (),
            exclude,
            f"no node failed {suspect_after} times in a row while the others were fine: the failure is not one node's "
            "(a bug in the code or the data fails everywhere); not leaving any node behind",
            active=stays,
        )
    blamed = "; ".join(f"{n}: {ledger.record(n).why()}" for n in drop)
    if after_failure and ledger.left_any and newest_checkpoint == ledger.leave_checkpoint:
        return NodePlan(
            "stop",
            keep,
            (),
            exclude,
            f"failures went on after nodes were left behind, with no new checkpoint since ({blamed}): "
            "the fault follows the job, not a node; not leaving more nodes behind",
            active=stays,
        )
    unchecked = tuple(n for n in takes if n not in roster.checked) if roster.node_check else ()
    if unchecked and len(active) >= min_nodes:
        return NodePlan(
            "check", keep, drop, exclude, f"checking standby {', '.join(unchecked)} before it takes a slot ({blamed})", active, unchecked
        )
    lost = tuple(n for n in before if n not in stays)  # suspect, or gone from the allocation
    replaced = tuple(zip(lost, takes, strict=False)) if after_failure else ()
    if len(active) >= want and replaced:
        pairs = ", ".join(f"{n} with {by}" for n, by in replaced)
        spare = f"; {len(keep) - len(active)} standby left"
        return NodePlan("replace", keep, drop, exclude, f"replacing {pairs} ({blamed}){spare}", active, (), replaced)
    if len(active) >= min_nodes:
        short = (
            f"; no standby left: going on with {len(active)} node(s)" if len(active) < want else f"; going on with {len(active)} node(s)"
        )
        return NodePlan("shrink", keep, drop, exclude, f"leaving {', '.join(drop)} behind ({blamed}){short}", active, (), replaced)
    return NodePlan(
        "requeue",
        keep,
        drop,
        exclude,
        f"only {len(active)} healthy node(s) left, fewer than --min-nodes {min_nodes} ({blamed}): requeue excluding {', '.join(exclude)}",
        active,
    )
