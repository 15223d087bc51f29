"""The job chain's decisions, pure: what the batch job does next, from what just happened.

``step(config, state, event)`` returns the next state and the actions to carry out, in order;
``slurm.job`` carries them out (scontrol, srun, the event log) and feeds back what they
answered. Nothing here runs a process, reads the clock or touches a file.

The rules (they were the batch script's bash until #31):

- **The first signal decides.** USR1 (``--signal=B:USR1@T``, or ``scancel --signal=USR1``)
  comes back: checkpoint, requeue. A first TERM may be a time limit or a preemption (requeue)
  or ``scancel`` (stop for good): scontrol's JobState/Reason tells which, asked at once, and a
  scancel is recorded at once (``cancelled``): SIGKILL follows after KillWait, maybe before
  the checkpoint is done. The TERM that follows our own ``scontrol requeue`` decides nothing.
- **Asked to stop, whatever the exit**: a signal that came before ``ckpt run`` had installed
  its handler killed it (128+n); the last checkpoint is intact, so the chain requeues (or stops
  after scancel) as for an exit 75.
- **Exit codes of a round** (``ckpt run``): 0 finished; 75 checkpointed on request: requeue;
  anything else (1 restarts exhausted, 76 crash loop, 77 a node keeps failing, a node lost):
  ``ckpt nodes --after-failure`` says continue, replace (a standby of the allocation takes each
  suspect's slot: same size, same world), shrink (no standby left: leave the suspects behind and
  start the next round on fewer nodes), requeue (excluding them), finished, or stop (the training
  failed by itself). Either way the suspects are given back to SLURM (``scontrol update
  NodeList=KEEP``) before the next round.
- **Hot spares** (``--train-nodes N`` of a larger allocation): every round runs on the active
  nodes ``ckpt nodes`` named (``srun --nodelist``), the others stand by. ``check`` from ``ckpt
  nodes``: pre-flight the standbys about to take a slot (``--node-check``), then ask again with
  the ones that passed; a failed check is in the ledger, so the standby is left behind.
  ``--node-check-at-start`` checks every node of the allocation before the first question.
- **Requeues are bounded** (``max_requeues``, against SLURM's restart count) and need scontrol.
- **What the user is told** (``--notify``): a ``Notify`` beside the event of each end of the job
  (finished; failed, with the reason from ``ckpt run``'s exit code: ``crash_loop`` for 76,
  ``save_failed`` for 78...; stopped; cancelled; max requeues; no requeue possible), of each
  decision of ``ckpt nodes`` that leaves nodes behind or replaces them, and of each requeue. The
  driver runs the command for the events it was asked for (``core.notify``), once per job.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ckpt_tool.core.notify import failure_reason
from ckpt_tool.errors import RESTART_CANNOT_HELP

# --------------------------------------------------------------------------- config and state


@dataclass(frozen=True)
class ChainConfig:
    """What one start of the job knows before anything happens."""

    job_id: str
    restart: int  # SLURM_RESTART_COUNT: how often SLURM requeued this job
    max_requeues: int
    min_nodes: int
    scontrol: bool = True  # scontrol is on PATH (a container without SLURM tools has none)
    node_check_at_start: bool = False  # pre-flight every node of the allocation before the first round


@dataclass(frozen=True)
class ChainState:
    """Where the chain is: the phase waited in and what the signals so far decided."""

    phase: str = "start"  # start, nodes, recover, run, shrink, requeue, exclude, ended
    stopping: bool = False  # asked to stop (a signal), or our own requeue is under way
    stop_signal: str | None = None  # the first signal
    stop_cause: str | None = None  # time-limit, preemption, scancel, ...
    cancelled: bool = False  # the first TERM came from scancel: never requeue
    round: int = 0  # rounds of [recover -> srun] in this allocation
    after_failure: bool = False  # the nodes being asked about ended a failed round
    last_rc: int = 0  # the last round's exit
    keep: str = "-"  # ckpt nodes' last answer (comma lists, - for none)
    drop: str = "-"
    exclude: str = "-"
    active: str = "-"  # the nodes that run (ran) the round; - : the whole allocation
    replaced: str = "-"  # suspect:standby pairs of the last replace
    checked: str = "-"  # nodes whose pre-flight check passed for the decision under way


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Started:
    """The job (re)started on ``nodes`` (SLURM_JOB_NODELIST); the signal handlers are installed."""

    nodes: str


@dataclass(frozen=True)
class SignalArrived:
    """The batch step got a signal: ``USR1`` (the time-limit warning, or ``scancel --signal=USR1``) or
    ``TERM``; the first one decides the chain's course."""

    name: str  # "USR1" or "TERM"


@dataclass(frozen=True)
class SlurmSaid:
    """``scontrol show job``'s JobState and Reason ("" when it did not answer)."""

    job_state: str
    reason: str


@dataclass(frozen=True)
class RecoverExited:
    """``ckpt recover`` ended with exit status ``rc`` (0: the decision is written; 1 when it could not be
    run)."""

    rc: int


@dataclass(frozen=True)
class RunExited:
    """The ``srun`` of ``ckpt run`` on every node ended with exit status ``rc``."""

    rc: int  # srun's exit status; death by signal n as 128+n (see ``exit_status``)


@dataclass(frozen=True)
class NodesSaid:
    """``ckpt nodes``' answer: ACTION KEEP DROP EXCLUDE ACTIVE CHECK REPLACED; ``action=None``: it failed."""

    action: str | None
    keep: str = "-"
    drop: str = "-"
    exclude: str = "-"
    active: str = "-"
    check: str = "-"
    replaced: str = "-"


@dataclass(frozen=True)
class NodesChecked:
    """The pre-flight checks (``--node-check``) ended: the nodes that ``passed`` and those that ``failed``
    (each already recorded as a ``node_check`` event)."""

    passed: str = "-"
    failed: str = "-"


@dataclass(frozen=True)
class ShrinkDone:
    """``scontrol update NodeList=KEEP`` and the resize script's values (None: it failed)."""

    nodelist: str | None
    num_nodes: str | None = None


@dataclass(frozen=True)
class RequeueDone:
    """``scontrol requeue`` answered: ``ok`` when it took."""

    ok: bool


@dataclass(frozen=True)
class ExcludeDone:
    """``scontrol update ExcNodeList`` answered after its retries: ``ok`` when it took."""

    ok: bool  # ExcNodeList took (the job was pending in time)


Event = Started | SignalArrived | SlurmSaid | RecoverExited | RunExited | NodesSaid | NodesChecked | ShrinkDone | RequeueDone | ExcludeDone

# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Log:
    """A line of the job's output, ``[ckpt job=ID restart=N HH:MM:SS] text``."""

    text: str


@dataclass(frozen=True)
class Note:
    """An event in RUN_DIR/events.jsonl (``supervise.run_dir.note``)."""

    event: str
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Notify:
    """Tell the user's ``--notify`` command about ``event`` (run once per job, for the events it
    was asked for; ``core.notify`` builds what it reads). ``fields``: the event's, and ``reason``
    for a failed job."""

    event: str
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ForwardStop:
    """USR1 to the payload running now (``ckpt run`` under srun), if any: checkpoint and stop.
    srun relays it to every node's ``ckpt run``, whose handler is not there until it has started
    (USR1's default action kills, and one node killed at its start leaves the others waiting in
    the rendezvous): the driver sends it once every node of the round is ready (``round_ready``),
    or after ``STOP_HOLD_S`` whatever their state, or not at all when the payload ends first."""


@dataclass(frozen=True)
class AskSlurm:
    """``scontrol show job``: answered with SlurmSaid."""


@dataclass(frozen=True)
class AskNodes:
    """``ckpt nodes``: answered with NodesSaid. ``active``: the nodes that ran the last round,
    ``checked``: the standbys whose pre-flight passed (comma lists, - for none)."""

    after_failure: bool
    active: str = "-"
    checked: str = "-"


@dataclass(frozen=True)
class CheckNodes:
    """The pre-flight check on each of ``nodes`` (- : every node of the allocation), in parallel:
    answered with NodesChecked."""

    nodes: str = "-"


@dataclass(frozen=True)
class StartRecover:
    """``ckpt recover`` for the round's ``nodes`` (- : the whole allocation): answered with RecoverExited."""

    nodes: str = "-"


@dataclass(frozen=True)
class StartRun:
    """srun: one ``ckpt run`` on each of ``nodes`` (- : the whole allocation), round ``round``:
    answered with RunExited."""

    round: int
    nodes: str = "-"


@dataclass(frozen=True)
class Shrink:
    """``scontrol update NodeList=keep``: answered with ShrinkDone."""

    keep: str


@dataclass(frozen=True)
class Requeue:
    """``scontrol requeue``: answered with RequeueDone."""


@dataclass(frozen=True)
class Exclude:
    """``scontrol update ExcNodeList=nodes``, retried in the background, deaf to TERM: answered with ExcludeDone."""

    nodes: str


@dataclass(frozen=True)
class Exit:
    """End ``ckpt job`` with exit status ``code``: the last action of every chain."""

    code: int


Action = Log | Note | Notify | ForwardStop | AskSlurm | AskNodes | CheckNodes | StartRecover | StartRun | Shrink | Requeue | Exclude | Exit
Step = tuple[ChainState, tuple[Action, ...]]

USR1_CAUSE = "time-limit warning or scancel --signal=USR1"


def note(event: str, **fields: object) -> Note:
    """A Note whose fields are strings, as ``ckpt note KEY=VALUE`` wrote them."""
    return Note(event, tuple((k, str(v)) for k, v in fields.items()))


def notify(event: str, **fields: object) -> Notify:
    """A Notify whose fields are strings, as the Note's."""
    return Notify(event, tuple((k, str(v)) for k, v in fields.items()))


def told(recorded: Note) -> tuple[Note, Notify]:
    """The event, recorded and told: its Note, then its Notify with the same fields."""
    return recorded, Notify(recorded.event, recorded.fields)


def failed(rc: int, reason: str | None = None) -> tuple[Note, Notify]:
    """``job_failed``: recorded with the exit code; told with the reason too (``crash_loop``,
    ``save_failed``...: from ``rc`` unless given)."""
    return note("job_failed", exit_code=rc), notify("job_failed", exit_code=rc, reason=reason or failure_reason(rc))


# --------------------------------------------------------------------------- the rules


def stopped_by_slurm(job_state: str, reason: str) -> str | None:
    """Why SLURM itself sent a TERM ("time-limit", "preemption"), or None (scancel)."""
    if job_state == "TIMEOUT" or reason.startswith("TimeLimit"):
        return "time-limit"
    if job_state == "PREEMPTED" or reason.startswith("Preempt"):
        return "preemption"
    return None


def exit_status(returncode: int) -> int:
    """A child's status as the shell reports it: killed by signal n (Popen's -n) is 128+n."""
    return 128 - returncode if returncode < 0 else returncode


def step(cfg: ChainConfig, st: ChainState, ev: Event) -> Step:
    """The next state and the actions for ``ev``."""
    if isinstance(ev, SignalArrived):
        return _on_signal(st, ev.name)
    if isinstance(ev, SlurmSaid):
        return _on_slurm(cfg, st, ev)
    if isinstance(ev, Started):
        start = (Log("ready: trap installed"), note("job_start", job_id=cfg.job_id, restarts=cfg.restart, nodes=ev.nodes))
        if cfg.node_check_at_start:
            return replace(st, phase="check", after_failure=False), (*start, Log("checking every node before training"), CheckNodes())
        return replace(st, phase="nodes", after_failure=False), (*start, AskNodes(after_failure=False))
    if isinstance(ev, NodesSaid):
        # ckpt nodes failing: go on at the start (a node may be handed back), stop after a failure
        action = ev.action or ("stop" if st.after_failure else "continue")
        if action == "check":
            return replace(st, phase="check"), (Log(f"checking standby {ev.check} before it takes a slot"), CheckNodes(ev.check))
        said = replace(st, keep=ev.keep, drop=ev.drop, exclude=ev.exclude, replaced=ev.replaced, checked="-")
        st2, actions = _act(cfg, replace(said, active=ev.active) if ev.action else said, action)
        return st2, (*_left_behind(ev), *actions)
    if isinstance(ev, NodesChecked):
        checked = ",".join(n for n in (*st.checked.split(","), *ev.passed.split(",")) if n != "-") or "-"
        st2 = replace(st, phase="nodes", checked=checked)
        said = Log(f"node check: passed {ev.passed}, failed {ev.failed}")
        if st.stopping:
            st3, actions = _requeue_or_stop(cfg, st2)
            return st3, (said, *actions)
        return st2, (said, AskNodes(st.after_failure, st.active, checked))
    if isinstance(ev, RecoverExited):
        if st.stopping:
            return _requeue_or_stop(cfg, st)
        if ev.rc != 0:
            return _end(st, *failed(ev.rc, "recover_failed"), Log(f"ckpt recover failed (exit {ev.rc}): not starting training"), code=ev.rc)
        return replace(st, phase="run"), (*_roster_note(st), StartRun(st.round, st.active))
    if isinstance(ev, RunExited):
        return _on_run_exit(cfg, st, ev.rc)
    if isinstance(ev, ShrinkDone):
        if ev.nodelist is None:
            st2, actions = _requeue(cfg, st, f"could not leave {st.drop} behind")
            return st2, (Log(f"scontrol update NodeList={st.keep} failed: requeuing instead"), *actions)
        pairs = [p.split(":") for p in st.replaced.split(",") if ":" in p]
        how = f"replaced {', '.join(f'{n} with {by}' for n, by in pairs)}" if pairs else f"left {st.drop} behind"
        shrunk = (
            Log(f"{how}: going on with {_count(st.active) or ev.num_nodes} node(s) ({st.active if st.active != '-' else ev.nodelist})"),
            note("shrunk", dropped=st.drop, nodes=ev.nodelist, num_nodes=ev.num_nodes),
        )
        st2, actions = _go_on(cfg, st)
        return st2, (*shrunk, *actions)
    if isinstance(ev, RequeueDone):
        if not ev.ok:
            return _end(st, *told(note("requeue_failed", reason="scontrol-requeue-failed")), Log("scontrol requeue failed"), code=75)
        if st.exclude != "-":
            return replace(st, phase="exclude"), (Exclude(st.exclude),)
        return _end(st, code=0)
    if isinstance(ev, ExcludeDone):
        return _end(st, *((note("excluded", nodes=st.exclude),) if ev.ok else ()), code=0)
    raise TypeError(f"not an event of the chain: {ev!r}")


def _count(names: str) -> int:
    """Nodes in a comma list (0 for -)."""
    return len([n for n in names.split(",") if n and n != "-"])


def _left_behind(ev: NodesSaid) -> tuple[Action, ...]:
    """The Notify of a ``ckpt nodes`` answer that leaves nodes behind (it recorded the events
    itself): ``replaced`` when standbys take their slots, else ``nodes_left_behind``."""
    if ev.action not in ("replace", "shrink", "requeue") or ev.drop == "-":
        return ()
    fields = {"action": ev.action, "drop": ev.drop, "keep": ev.keep, "exclude": ev.exclude}
    if ev.action == "replace" and ev.replaced != "-":
        return (notify("replaced", **fields, replaced=ev.replaced),)
    return (notify("nodes_left_behind", **fields),)


def _roster_note(st: ChainState) -> tuple[Action, ...]:
    """The ``nodes_active`` event of a round that runs on named nodes: which train, which stand by."""
    if st.active == "-":
        return ()
    standby = ",".join(n for n in st.keep.split(",") if n not in st.active.split(",") and n != "-") or "-"
    return (note("nodes_active", active=st.active, standby=standby, round=st.round),)


def _end(st: ChainState, *actions: Action, code: int) -> Step:
    return replace(st, phase="ended"), (*actions, Exit(code))


def _on_signal(st: ChainState, name: str) -> Step:
    first = st.stop_signal is None and not st.stopping  # not a second signal, not our own requeue's TERM
    cause = USR1_CAUSE if first and name == "USR1" else st.stop_cause
    st2 = replace(st, stopping=True, stop_signal=st.stop_signal or name, stop_cause=cause)
    actions: tuple[Action, ...] = (Log(f"got {name}: asking ckpt run to checkpoint and stop"), ForwardStop())
    if first and name == "TERM":
        actions += (AskSlurm(),)
    return st2, actions


def _on_slurm(cfg: ChainConfig, st: ChainState, ev: SlurmSaid) -> Step:
    cause = stopped_by_slurm(ev.job_state, ev.reason)
    if cause is not None:
        return replace(st, stop_cause=cause), ()
    return replace(st, cancelled=True, stop_cause="scancel"), (
        Log("TERM from scancel (not a time limit or preemption): checkpointing, then stopping; not requeuing"),
        *told(note("cancelled", cause="scancel", requeued="no", restarts=cfg.restart)),
    )


def _on_run_exit(cfg: ChainConfig, st: ChainState, rc: int) -> Step:
    said = Log(f"ckpt run exited with {rc}")
    if rc == 0:
        return _end(st, said, Log("training finished"), *told(note("job_finished")), code=0)
    if st.stopping or rc == 75:  # asked to stop: requeue whatever the exit (128+n: killed before its handler)
        st2, actions = _requeue_or_stop(cfg, st)
        return st2, (said, *actions)
    if rc in RESTART_CANNOT_HELP:  # the same command, checkpoint or data fails the same way on any node
        why = f"training stopped on an error a restart cannot fix (exit {rc}: {CANNOT_HELP_WORDS.get(rc, 'see the events')}): not requeuing (see ckpt status)"
        return _end(st, said, Log(why), *failed(rc), code=rc)
    return replace(st, phase="nodes", after_failure=True, last_rc=rc), (said, AskNodes(after_failure=True, active=st.active))


def _act(cfg: ChainConfig, st: ChainState, action: str) -> Step:
    if action == "continue":
        return _go_on(cfg, st)
    if action in ("shrink", "replace"):  # both give the suspects back; a replace keeps the round's size
        return replace(st, phase="shrink"), (Shrink(st.keep),)
    if action == "requeue":
        return _requeue(cfg, st, f"too few healthy nodes: need {cfg.min_nodes}")
    if action == "finished":
        return _end(st, Log("training finished"), *told(note("job_finished")), code=0)
    if not st.after_failure:  # "stop" at the start: nothing failed yet, train
        return _go_on(cfg, st)
    rc = st.last_rc
    return _end(
        st,
        Log(f"training failed (exit {rc}), not a node's fault: not requeuing (see ckpt status)"),
        *failed(rc),
        code=rc,
    )


def _go_on(cfg: ChainConfig, st: ChainState) -> Step:
    """The next round: ckpt recover, then srun (unless asked to stop meanwhile)."""
    st2 = replace(st, phase="recover", round=st.round + (1 if st.after_failure else 0), after_failure=False)
    if st.stopping:
        return _requeue_or_stop(cfg, st2)
    return st2, (StartRecover(st.active),)


def _requeue_or_stop(cfg: ChainConfig, st: ChainState) -> Step:
    if st.cancelled:
        return _end(
            st,
            Log("stopped by TERM (scancel, not a time limit or preemption): checkpointed, not requeuing"),
            *told(note("job_stopped", cause="scancel", requeued="no", restarts=cfg.restart)),
            code=0,
        )
    return _requeue(cfg, st, f"stopped by {st.stop_signal or 'the training'} ({st.stop_cause or 'asked'}) after a checkpoint")


def _requeue(cfg: ChainConfig, st: ChainState, reason: str) -> Step:
    r, limit = cfg.restart, cfg.max_requeues
    if r >= limit:
        return _end(
            st,
            Log(f"max requeues reached ({r} of {limit}): not requeuing; resume by hand with ckpt submit"),
            *told(note("max_requeues_reached", restarts=r, limit=limit)),
            code=75,
        )
    if not cfg.scontrol:
        return _end(
            st,
            Log("scontrol is not available here (a container without SLURM tools?): cannot requeue"),
            *told(note("requeue_failed", reason="no-scontrol")),
            code=75,
        )
    return replace(st, phase="requeue", stopping=True), (  # the TERM that follows the requeue is ours
        Log(f"requeuing (restart {r} of at most {limit}): {reason}"),
        *told(note("requeue", restarts=r, exclude=st.exclude, reason=reason)),
        Requeue(),
    )


# --------------------------------------------------------------------------- the round's command line


@dataclass(frozen=True)
class RunSpec:
    """What every round's ``ckpt run`` is given (the job's options)."""

    ckpt: tuple[str, ...]  # how to run ckpt, e.g. (python, "-m", "ckpt_tool.cli.main")
    ckpt_dir: str
    run_dir: str
    command: tuple[str, ...]
    nproc_per_node: int = 1
    max_restarts: int = 3
    suspect_after: int = 3
    min_nodes: int = 1
    straggler_suspect: bool = False


CANNOT_HELP_WORDS = {
    2: "bad arguments or input",
    3: "no valid checkpoint",
    4: "the checkpoint does not fit the run, or another job holds the directory",
    78: "saves kept failing: the disk",
    79: "a wrong value the replay reproduced: the data or the model",
}
STOP_HOLD_S = 60.0  # the longest a stop waits for the round's ckpt runs to install their handlers


def round_id(job_id: str, restart: int, round_: int) -> str:
    """A round's id: torchrun's rendezvous id, and the ``round`` of every event its ``ckpt run`` logs."""
    return f"{job_id}.{restart}.{round_}"


def round_ready(events: Sequence[Mapping[str, object]], round_: str, num_nodes: int) -> bool:
    """Whether ``num_nodes`` distinct nodes of round ``round_`` have logged ``start`` (each
    ``ckpt run`` logs it once its USR1/TERM handler is in place)."""
    started = {e.get("node") for e in events if e.get("event") == "start" and e.get("round") == round_}
    return len(started) >= num_nodes


def nnodes(min_nodes: int, num_nodes: int) -> str:
    """torchrun's --nnodes: an elastic range when fewer nodes may do (a lost agent is left out)."""
    return f"{min_nodes}:{num_nodes}" if min_nodes < num_nodes else str(num_nodes)


def srun_argv(
    spec: RunSpec, job_id: str, restart: int, round_: int, num_nodes: int, endpoint: str, nodelist: Sequence[str] = ()
) -> list[str]:
    """srun: one ``ckpt run`` per node (on ``nodelist`` when given: the active nodes, not the
    standbys), meeting at ``endpoint`` (the first node, a free port)."""
    run = [*spec.ckpt, "run", "--nproc-per-node", str(spec.nproc_per_node), "--nnodes", nnodes(spec.min_nodes, num_nodes)]
    run += ["--rdzv-endpoint", endpoint, "--rdzv-id", round_id(job_id, restart, round_), "--max-restarts", str(spec.max_restarts)]
    run += ["--suspect-after", str(spec.suspect_after), *(["--straggler-suspect"] if spec.straggler_suspect else [])]
    run += ["--ckpt-dir", spec.ckpt_dir, "--run-dir", spec.run_dir, "--", *spec.command]
    n = str(num_nodes)
    where = [f"--nodelist={','.join(nodelist)}"] if nodelist else []
    return ["srun", "--kill-on-bad-exit=0", "--ntasks-per-node=1", f"--nodes={n}", f"--ntasks={n}", *where, *run]


def parse_resize_script(text: str) -> dict[str, str]:
    """The ``export VAR=value`` lines of SLURM's ``slurm_job_ID_resize.sh`` as a dict."""
    env = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True) if line.strip() else []
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


def split_nodes(names: Sequence[str]) -> str:
    """A node list as the chain's fields write it: comma-joined, - for none."""
    return ",".join(names) or "-"
