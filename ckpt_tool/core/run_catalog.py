"""What a run directory holds, named once: its files (name, format version, writer, readers)
and every event ckpt-tool writes, with its fields, who writes it and what it means.

Pure (no I/O): ``supervise.run_dir`` reads and writes the files by these names and refuses to
write an event that is not listed here; ``ckpt history`` (``core.history.KNOWN_EVENTS``) and the
README's tables come from the same lists. A user's own events (``ckpt note RUN_DIR user.NAME``)
carry the ``user.`` prefix and are written as given.

Two logs share the shape ``{"event": str, "time": float, ...fields}`` and one name space (``ckpt
history`` merges them into one timeline, so a name means one thing in both):
``RUN_DIR/events.jsonl`` (``RUN_EVENTS``: the job, its rounds and ranks) and the checkpoint
directory's ``index.jsonl`` (``CHECKPOINT_EVENTS``: what happened to checkpoints, written by the
store under the directory's lock; listed here, written there). A reader keeps fields it does not
know (an event from a newer ckpt-tool reads as itself) and skips torn lines (``core.index``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tool.errors import CkptError, ExitCode, NewerFormatError

USER_PREFIX = "user."  # a user's own events: `ckpt note RUN_DIR user.lr_drop lr=0.1`

# ----------------------------------------------------------------------------- files

EVENTS_NAME = "events.jsonl"
HEALTH_NAME = "health.json"
ROUND_END_NAME = "round_end.json"
TIMEOUTS_NAME = "timeouts.json"
RANKS_PATTERN = "ranks.{node}.json"
RANK_HEALTH_PATTERN = "rank_health.{node}.json"
LINKS_PATTERN = "links.{node}.json"
STACKS_REQUEST_NAME = "stacks_request.json"
HANGS_DIR = "hangs"
HANG_REPORT_NAME = "report.json"  # in hangs/<id>/, beside each rank's rank_R.txt
ANOMALY_NAME = "anomaly.json"
COMMAND_NAME = "command.json"
METRICS_DIR = "metrics"
METRICS_PATTERN = "rank_{rank}.jsonl"  # in metrics/


@dataclass(frozen=True)
class RunFile:
    """One file of the run directory: ``version`` is the format this ckpt-tool writes and the
    newest it reads (a file without a ``version`` field is version 1, as written before)."""

    name: str
    version: int
    written_by: str
    read_by: str
    meaning: str


FILES: tuple[RunFile, ...] = (
    RunFile(EVENTS_NAME, 1, "ckpt run, ckpt recover, ckpt nodes, ckpt submit, ckpt job, ckpt note (a user's user.NAME)",
            "ckpt status, ckpt history, ckpt nodes, ckpt recover, the watchdog (health ledger), ckpt history --plot",
            "the run's event log: one JSON object per line, appended and fsynced (events below)"),
    RunFile(HEALTH_NAME, 1, "ckpt run (after each failure), ckpt nodes", "people and tools (ckpt status folds the events itself)",
            "the health ledger's latest fold: failures charged to each node, the suspects"),
    RunFile(ROUND_END_NAME, 1, "ckpt run (the node whose watchdog finds a suspect)", "every node's ckpt run of the round",
            "the marker that ends a round on every node: its round id, the suspects, whether a checkpoint comes first"),
    RunFile(TIMEOUTS_NAME, 1, "ckpt run (at exit)", "ckpt run (at its next start), ckpt submit (the signal lead)",
            "the phase durations observed and the timeouts calibrated from them, kept across restarts"),
    RunFile(RANKS_PATTERN, 1, "ckpt run (each node its own, at each rank's first beat)", "the recipes' fault injection, people (ps)",
            "the pid of each rank of the node's current attempt"),
    RunFile(RANK_HEALTH_PATTERN, 1, "ckpt run (each node its own, every 2 s)", "ckpt status, ckpt plan",
            "each rank's straggler score, step time and GPU use"),
    RunFile(LINKS_PATTERN, 1, "ckpt run (each node its own, every 10 s while training)", "every node's ckpt run (slow links)",
            "the bytes/s this node's watchdog sent to each peer's and had acknowledged, with the round and the time"),
    RunFile(STACKS_REQUEST_NAME, 1, "ckpt run (the node that finds a hang), ckpt stacks", "every node's ckpt run",
            "asks every node's watchdog for its ranks' stacks: the hangs/ directory they go to, the round (or any)"),
    RunFile(f"{HANGS_DIR}/<id>/", 1, "ckpt run (each node its ranks' rank_R.txt; report.json), ckpt stacks", "ckpt status, ckpt history, people",
            "one hang or request: each rank's Python stacks (all threads), each node's reach.NODE.json (the peers it reached) and report.json"),
    RunFile(HANG_REPORT_NAME, 1, "ckpt run, ckpt stacks", "ckpt status, ckpt stacks", "in hangs/<id>/: the culprit(s), the victims, every rank's verdict"),
    RunFile(COMMAND_NAME, 1, "ckpt run (at its start)", "ckpt replay",
            "the training command ckpt run ran: its arguments after --, the directory it ran in, the processes per node"),
    RunFile(ANOMALY_NAME, 1, "the training (rank 0, at a wrong number and at the replay's verdict)", "every rank at its start, ckpt status",
            "the last anomaly: replaying (the step, the checkpoint it replays from, every rank's findings) or done (the verdict)"),
    RunFile(f"{METRICS_DIR}/{METRICS_PATTERN}", 1, "the training (each rank its own, every step it gives metrics)",
            "the training (a replay's reference, the spike window at a restart), people",
            "one JSON line per step: {step, values} as the rank gave them (NaN and Infinity as Python's json writes them)"),
)  # fmt: skip
_FILE_BY_NAME = {f.name: f for f in FILES}


def run_file(name: str) -> RunFile:
    """The spec of a run file by its name (``ranks.n1.json`` finds ``ranks.{node}.json``)."""
    if name in _FILE_BY_NAME:
        return _FILE_BY_NAME[name]
    if name.startswith(f"{METRICS_DIR}/rank_") and name.endswith(".jsonl"):
        return _FILE_BY_NAME[f"{METRICS_DIR}/{METRICS_PATTERN}"]
    for pattern in (RANKS_PATTERN, RANK_HEALTH_PATTERN, LINKS_PATTERN):
        head, tail = pattern.split("{node}")
        if name.startswith(head) and name.endswith(tail):
            return _FILE_BY_NAME[pattern]
    raise KeyError(f"{name} is not a file of the run directory")


def stamped(name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with the ``version`` this ckpt-tool writes for file ``name``."""
    return {"version": run_file(name).version, **{k: v for k, v in data.items() if k != "version"}}


def check_version(name: str, data: object, where: str) -> dict[str, Any]:
    """``data`` read from file ``name`` (at ``where``) as a dict this ckpt-tool can read.

    Not a JSON object: ``CkptError`` (exit 1, the file is damaged). A ``version`` newer than this
    ckpt-tool writes: ``NewerFormatError`` (exit 4) that says so and what to do, never a KeyError
    on a renamed field. No ``version``: version 1 (written before files were versioned)."""
    if not isinstance(data, dict):
        raise CkptError(f"{where} is not a JSON object", f"remove it: ckpt run writes it anew ({run_file(name).meaning})")
    version = data.get("version", 1)
    newest = run_file(name).version
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CkptError(f"{where} has version {version!r}, not a number >= 1", "remove it: ckpt run writes it anew")
    if version > newest:
        raise NewerFormatError(
            f"{where} is version {version}, written by a newer ckpt-tool; this one reads up to version {newest}",
            "run the ckpt-tool that wrote it (pip install -U ckpt-tool), or remove the file to start it anew",
        )
    return data


# ----------------------------------------------------------------------------- events

RUN = ("node", "round", "attempt")  # every event ckpt run writes: where and in which attempt
STOP = ("purpose", "signals", "note")


@dataclass(frozen=True)
class EventSpec:
    """One event: its ``name``, the fields it carries (besides ``event`` and ``time``), who writes
    it, what it means, and its log (``events.jsonl`` of the run, or ``index.jsonl`` of the
    checkpoint directory)."""

    name: str
    fields: tuple[str, ...]
    written_by: str
    meaning: str
    log: str = EVENTS_NAME


_W = "ckpt run"
_S = "ckpt job (the batch script's chain)"
_T = "the training (CheckpointManager), logged by ckpt run"
RUN_EVENTS: tuple[EventSpec, ...] = (
    # ckpt run: the watchdog
    EventSpec("start", (*RUN, "argv", "timeouts", "gpu_monitor", "launched"), _W,
              "ckpt run started torchrun on this node (launched: when the ckpt run process itself started)"),
    EventSpec("ranks_started", (*RUN, "rank", "phase", "warm"), _W, "the first beat of an attempt's ranks on this node"),
    EventSpec("resumed", (*RUN, "rank", "step", "checkpoint"), _W, "the ranks trained their first step after loading a checkpoint"),
    EventSpec("restarted", (*RUN, "torchrun_restart_count"), _W, "torchrun restarted the group of ranks (a new attempt)"),
    EventSpec("rank_exited", (*RUN, "rank", "local_rank", "pid", "step", "phase", "cause", "reason", "note"), _W,
              "a rank failed: cause crashed, killed, hung, peer_failure (a victim) or terminated"),
    EventSpec("hang", (*RUN, "rank", "local_rank", "pid", "step", "phase", "silent_s", "timeout_s", "culprit", "where", "waiting_in"), _W,
              "a rank was silent past its phase's timeout (culprit: the hang report's, from the stacks; where, waiting_in)"),
    EventSpec("hang_report", (*RUN, "summary", "culprits", "culprit_nodes", "victims", "attributed", "reason", "stacks", "stacks_s"), _W,
              "who hung the job and where (core.hang_report), the ranks' stacks written to `stacks` in `stacks_s` s, before the kill"),
    EventSpec("stacks_written", (*RUN, "ranks", "stacks", "stacks_s", "requested_by"), _W,
              "this node's ranks' stacks, written on another node's or `ckpt stacks`'s request"),
    EventSpec("killed_ranks", (*RUN, "pids", "teardown_s"), _W, "the ranks of a hung attempt were killed"),
    EventSpec("failure_counted", (*RUN, "in_a_row_without_progress", "limit", "newest_checkpoint"), _W,
              "a failure without a new checkpoint, counted toward the crash loop"),
    EventSpec("crash_loop", (*RUN, "message"), _W, "too many failures in a row without a new checkpoint: the job stops"),
    EventSpec("fatal", (*RUN, "rank", "exit_code", "message", "note"), _W, "a rank's error a restart cannot fix: not restarted"),
    EventSpec("finished", (*RUN, "exit_code"), _W, "the training ended well on this node"),
    EventSpec("failed", (*RUN, "torchrun_exit_code", "note"), _W, "torchrun gave up (its --max-restarts spent)"),
    EventSpec("stop_requested", (*RUN, "ranks", *STOP), _W, "the ranks were asked to checkpoint and stop (USR1, TERM or a round end)"),
    EventSpec("stopped_for_requeue", (*RUN, "step", "exit_code", "torchrun_exit_code", *STOP), _W,
              "the stop's checkpoint is committed: exit 75, the batch script requeues"),
    EventSpec("stop_deadline", (*RUN, "seconds", "note"), _W, "no checkpoint committed within the stop deadline; the previous one is intact"),
    EventSpec("round_ending", (*RUN, "suspects", "note"), _W, "a node is suspect: checkpoint at the next step, then leave it behind"),
    EventSpec("round_ended", (*RUN, "suspects", "step", "note"), _W, "the round ended (exit 77) so that the batch script leaves the suspects behind"),
    EventSpec("straggler", (*RUN, "rank", "phase", "step", "time_s", "peers_median_s", "slower_x", "score", "steps_below", "suspect"), _W,
              "a rank stays slower than its peers (once per episode)"),
    EventSpec("slow_link", (*RUN, "share", "mb_s", "others_mb_s", "checks", "note", "suspect"), _W,
              "this node's link carries a fraction (share) of the others' rate in link checks in a row: a straggler of the network"),
    EventSpec("straggler_cleared", (*RUN, "rank", "phase", "step", "time_s", "peers_median_s", "slower_x", "score", "steps_below"), _W,
              "a straggling rank keeps up again"),
    EventSpec("gpu_idle", (*RUN, "rank", "gpu", "util", "peers_util", "samples"), _W, "a rank's GPU idles while its peers work"),
    EventSpec("gpu_error", (*RUN, "rank", "gpu", "xids", "ecc_uncorrected_new", "suspect"), _W,
              "a GPU reported an uncorrected ECC error or a critical XID: its node is suspect"),
    EventSpec("anomaly", (*RUN, "rank", "step", "field", "value", "kind", "threshold", "action", "why"), _T,
              "a rank's value was wrong (NaN, infinite, a spike above median + k x MAD): replay, stop or warn (action)"),
    EventSpec("audit", (*RUN, "rank", "step", "from_step", "action", "why"), _T,
              "an audit (audit_every): the steps up to `step` are recomputed from checkpoint `from_step` and compared (action replay), or skipped (warn)"),
    EventSpec("anomaly_replayed", (*RUN, "verdict", "ranks", "step", "differs_at", "action", "differences", "anomalies", "message", "data"), _T,
              "the replay's verdict: transient (it differs: a hardware fault; ranks named), reproducible (the data or the model) or audited (an audit: the same bits)"),
    EventSpec("silent_fault", (*RUN, "rank", "step", "differences"), _T,
              "this rank computed a value its replay does not reproduce (a transient hardware fault): its node is charged a failure"),
    EventSpec("spares_started", (*RUN, "count"), _W, "spare rank processes are being pre-warmed"),
    EventSpec("spares_ready", (*RUN, "count", "seconds"), _W, "the spares have imported torch and wait"),
    EventSpec("warm_off", (*RUN, "reason", "note"), _W, "no spares from now on (the spare maker failed or was unsafe): ranks start cold"),
    # ckpt recover, ckpt nodes, ckpt submit
    EventSpec("recover", ("action", "step", "rolled_back_from", "quarantined", "saved_world_size", "world_size", "cleanup", "seconds",
                          "reshard", "nodes", "nodes_before", "hashes_checked", "store", "facts"),
              "ckpt recover", "the decision taken at this start: fresh or resume from a step (and how), with the reshard plan"),
    EventSpec("nodes_left_behind", ("action", "drop", "keep", "reason", "checkpoint"), "ckpt nodes",
              "suspect nodes are left behind: a standby takes their slot (replace), or shrink to the rest, or requeue without them"),
    EventSpec("replaced", ("node", "by", "reason"), "ckpt nodes",
              "a hot spare (standby) takes the slot of a node left behind: same node count, same world size"),
    EventSpec("submitted", ("job_id", "script", "via"), "ckpt submit", "the job was submitted (script: its sbatch file; via: the Python API)"),
    # the job chain, `ckpt job` (slurm/chain.py: the names and fields the batch script wrote with `ckpt note`)
    EventSpec("job_start", ("job_id", "restarts", "nodes"), _S, "the batch script started (first start or a requeue)"),
    EventSpec("shrunk", ("dropped", "nodes", "num_nodes"), _S, "the suspects were given back (scontrol update NodeList): the job goes on without them"),
    EventSpec("nodes_active", ("active", "standby", "round"), _S, "a round starts on the active nodes; the standbys (hot spares) run no ranks"),
    EventSpec("node_check", ("node", "result", "exit_code", "detail", "seconds"), _S,
              "a node's pre-flight check (--node-check): passed, or failed and the node is left behind"),
    EventSpec("excluded", ("nodes",), _S, "the requeued job will avoid these nodes (ExcNodeList)"),
    EventSpec("requeue", ("restarts", "exclude", "reason"), _S, "the job was requeued (once per requeue: each node's ckpt run logs its own stop)"),
    EventSpec("requeue_failed", ("reason",), _S, "the job could not be requeued (no scontrol, or scontrol requeue refused)"),
    EventSpec("max_requeues_reached", ("restarts", "limit"), _S, "the job stops: it was requeued as many times as allowed"),
    EventSpec("cancelled", ("cause", "requeued", "restarts"), _S, "scancel ended the job: not requeued"),
    EventSpec("job_stopped", ("cause", "requeued", "restarts"), _S, "the job stopped after the stop's checkpoint on scancel: not requeued"),
    EventSpec("job_finished", (), _S, "the training finished: the job ends"),
    EventSpec("job_failed", ("exit_code",), _S, "ckpt run (or ckpt recover) failed in a way a requeue cannot fix: the job ends"),
    EventSpec("notify_failed", ("for_event", "exit_code", "detail", "seconds"), _S,
              "the --notify command failed (exit_code) or was killed at its timeout (exit_code null) on for_event; the job goes on"),
)  # fmt: skip

_I = "the checkpoint store"
CHECKPOINT_EVENTS: tuple[EventSpec, ...] = tuple(
    EventSpec(name, fields, by, meaning, "index.jsonl")
    for name, fields, by, meaning in (
        ("commit", ("step", "bytes", "run_id", "world_size", "mesh", "global_batch", "probe_loss", "created_at", "blocked_s"), _I,
         "a checkpoint was committed (manifest last, LATEST moved); blocked_s: the seconds its save blocked rank 0's training"),
        ("validated", ("step", "ok", "problems"), "ckpt validate, ckpt recover --full", "a checkpoint's hashes were checked"),
        ("verified", ("step", "ok", "problems"), "ckpt verify, ckpt recover", "a checkpoint's probe was recomputed after a load"),
        ("quarantine", ("step", "reason", "moved_to"), _I, "a damaged checkpoint was moved aside (never deleted by recovery)"),
        ("quarantine_purged", ("names", "bytes"), "ckpt quarantine purge", "quarantined checkpoints were deleted"),
        ("restored", ("step", "moved_from"), "ckpt quarantine restore", "a quarantined checkpoint was put back"),
        ("rollback", ("step", "previous", "reason"), "ckpt rollback, ckpt recover", "LATEST moved back to an older step"),
        ("roll_forward", ("step", "previous"), "ckpt recover", "LATEST moved forward to a newer complete step"),
        ("repair_latest", ("step", "reason"), "ckpt recover", "a missing or broken LATEST was rewritten"),
        ("delete", ("step", "reason"), "retention", "a checkpoint was deleted by the retention policy"),
        ("cleanup", ("name", "reason"), "ckpt recover", "a directory left by a crash (a partial save) was removed"),
        ("owner", ("job_id", "host", "pid", "reason"), _I, "a job took the checkpoint directory's ownership"),
        ("reshard_plan", ("step", "world_size", "batch"), "ckpt reshard --plan", "a reshard plan was recorded in a manifest's lineage"),
        ("reshard", ("step", "from_world_size", "to_world_size", "batch"), "the training (resume)",
         "the ranks resumed a checkpoint saved at another world size (the plan: both meshes, the batch)"),
        ("adopted", ("step", "source", "format", "tensors"), "ckpt adopt", "weights from outside became a checkpoint"),
        ("local_saved", ("step", "holders", "keep", "bytes", "world_size", "mesh", "global_batch", "created_at"),
         "the training (local tier)", "a fast-tier checkpoint was saved on the nodes' local disks"),
        ("local_cleared", (), "the training (local tier)", "the nodes' local checkpoints were removed at the end of the run"),
        ("resharded_from", ("source", "step", "world_size"), "ckpt reshard", "lineage: the checkpoint was resharded from another"),
    )
)  # fmt: skip

EVENTS: Mapping[str, EventSpec] = {e.name: e for e in (*RUN_EVENTS, *CHECKPOINT_EVENTS)}
assert len(EVENTS) == len(RUN_EVENTS) + len(CHECKPOINT_EVENTS), "an event name is listed twice"

# The events after which a job is over, one way or another: ``ckpt status`` shows the newest as its final state.
FINAL_EVENTS = frozenset({"job_finished", "job_failed", "cancelled", "max_requeues_reached", "requeue_failed", "crash_loop", "fatal"})
assert FINAL_EVENTS <= {e.name for e in RUN_EVENTS}, "a final event is not a run event of the catalog"


def is_user_event(name: str) -> bool:
    """A user's own event: ``user.`` and a name after it."""
    return name.startswith(USER_PREFIX) and len(name) > len(USER_PREFIX) and name.strip() == name


def check_event_name(name: str) -> str:
    """``name`` when it may be written to ``events.jsonl``: a run event of the catalog or a user's
    own (``user.NAME``). Anything else: ``CkptError`` (exit 2) naming the rule, nothing written."""
    spec = EVENTS.get(name)
    if (spec is not None and spec.log == EVENTS_NAME) or is_user_event(name):
        return name
    where = "a checkpoint directory's index.jsonl event (written by the store)" if spec is not None else "not an event ckpt-tool knows"
    near = difflib.get_close_matches(name, [e.name for e in RUN_EVENTS], n=1, cutoff=0.75) if spec is None else []
    raise CkptError(
        f"event {name!r} is {where}" + (f" (did you mean {near[0]!r}?)" if near else ""),
        f"name your own events {USER_PREFIX}NAME (e.g. {USER_PREFIX}{name or 'my_event'}); ckpt-tool's run events: "
        + ", ".join(e.name for e in RUN_EVENTS),
        ExitCode.USAGE,
    )


def events_table(specs: tuple[EventSpec, ...] = RUN_EVENTS) -> str:
    """The events as a markdown table (name, fields, written by, meaning), for the README."""
    rows = [f"| `{e.name}` | {', '.join(e.fields) or '-'} | {e.written_by} | {e.meaning} |" for e in specs]
    return "\n".join(["| event | fields | written by | meaning |", "|---|---|---|---|", *rows])


def files_table() -> str:
    """The run directory's files as a markdown table (name, version, written by, read by, meaning)."""
    rows = [f"| `{f.name}` | {f.version} | {f.written_by} | {f.read_by} | {f.meaning} |" for f in FILES]
    return "\n".join(["| file | version | written by | read by | meaning |", "|---|---|---|---|---|", *rows])
