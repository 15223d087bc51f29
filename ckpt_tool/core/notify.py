"""The job chain's notifications, pure: which events notify, and what a notification says.

``ckpt submit --notify CMD`` puts the command into the batch script; ``ckpt job`` runs it once per
event of the job (not once per node) with the event's JSON on stdin (``slurm.notify``). This module
decides what that JSON holds: the event and its fields (as the chain wrote them to
``RUN_DIR/events.jsonl``), why a job failed (``reason``, from ``ckpt run``'s exit code), the job
id, the directories, the nodes, a one-line ``message`` for people and the ``next`` command to type.
Nothing here runs a process, reads the clock or touches a file.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_tool.errors import CkptError, ExitCode

PAYLOAD_VERSION = 1
DEFAULT_TIMEOUT_S = 30.0
OUTPUT_TAIL_CHARS = 300  # of the command's output, kept in a notify_failed event
NOTIFY_FAILED_EVENT = "notify_failed"  # logged by ckpt job when the command failed or was killed at its timeout
# How the batch script hands --notify, --notify-on and --notify-timeout to ckpt job (exported, shell-quoted like any --env)
ENV_COMMAND, ENV_EVENTS, ENV_TIMEOUT = "CKPT_NOTIFY", "CKPT_NOTIFY_ON", "CKPT_NOTIFY_TIMEOUT"
ENV_NAMES = frozenset({ENV_COMMAND, ENV_EVENTS, ENV_TIMEOUT})

# What notifies when --notify-on does not narrow it: the ends of the job, a cancellation, the nodes it left behind.
NOTIFY_EVENTS: frozenset[str] = frozenset(
    {
        "job_finished",
        "job_failed",  # with reason: crash_loop, save_failed, restarts_exhausted, recover_failed...
        "cancelled",  # scancel: recorded at once, before the stop's checkpoint
        "job_stopped",  # ... and the job's end after it
        "max_requeues_reached",
        "requeue_failed",
        "nodes_left_behind",  # shrink onto the healthy nodes, or requeue without them
        "replaced",  # a standby took a failing node's slot
    }
)
# What --notify-on may name: the above and the routine requeue (a time limit, a preemption).
NOTIFIABLE_EVENTS: frozenset[str] = NOTIFY_EVENTS | {"requeue"}

# ckpt run's exit code -> the reason a failed job gives (README: exit codes of ckpt run)
FAILURE_REASONS: Mapping[int, str] = {
    ExitCode.FAILED: "restarts_exhausted",
    ExitCode.USAGE: "bad_input",
    ExitCode.NOT_FOUND: "no_valid_checkpoint",
    ExitCode.CONFLICT: "checkpoint_conflict",
    ExitCode.CRASH_LOOP: "crash_loop",
    ExitCode.NODE_FAULT: "node_fault",
    ExitCode.SAVE_FAILED: "save_failed",
    ExitCode.ANOMALY: "reproducible_anomaly",
}
_REASON_WORDS = {
    "restarts_exhausted": "ckpt run's restarts were spent",
    "bad_input": "bad arguments or input",
    "no_valid_checkpoint": "no valid checkpoint",
    "checkpoint_conflict": "the checkpoint does not fit the run, or another job holds the directory",
    "crash_loop": "a crash loop: failures in a row without a new checkpoint",
    "node_fault": "a node kept failing and none could be left behind",
    "save_failed": "saves kept failing (the disk: full, read-only, permissions?); the previous checkpoint is intact",
    "reproducible_anomaly": "a wrong value the replay reproduced: the data or the model",
    "recover_failed": "ckpt recover failed before training",
}
_LIST_FIELDS = ("drop", "keep", "exclude")  # the chain's comma lists (- for none), given as JSON lists


def failure_reason(exit_code: int) -> str:
    """Why ``ckpt run`` stopped, from its exit code: ``crash_loop`` (76), ``save_failed`` (78)...,
    or ``exit_N`` for a code without a name (a node lost, a signal)."""
    return FAILURE_REASONS.get(exit_code, f"exit_{exit_code}")


def parse_events(values: Iterable[str]) -> frozenset[str]:
    """``--notify-on`` values (repeatable, each a comma list) as a set of event names; none given:
    the default ``NOTIFY_EVENTS``. A name that cannot notify is a ``CkptError`` (exit 2) listing those that can."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in NOTIFIABLE_EVENTS]
    if unknown:
        raise CkptError(
            f"--notify-on {','.join(unknown)}: not an event the job notifies",
            f"choose among {', '.join(sorted(NOTIFIABLE_EVENTS))}, e.g. --notify-on job_finished,job_failed",
            ExitCode.USAGE,
        )
    return frozenset(names) or NOTIFY_EVENTS


@dataclass(frozen=True)
class NotifyConfig:
    """``--notify CMD``: a shell command (``sh -c``) run with each selected event's JSON on stdin,
    killed after ``timeout_s``. Raises ``CkptError`` (exit 2) for an empty command, one of several
    lines, an event that cannot notify or a timeout below 0.1 s."""

    command: str
    events: frozenset[str] = NOTIFY_EVENTS
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise CkptError(
                "--notify is empty: there is no command to run",
                "give a shell command that reads the event's JSON on stdin, e.g. "
                "--notify 'curl -sS -X POST -H \"Content-Type: application/json\" --data-binary @- https://hooks.example/T0K3N'",
                ExitCode.USAGE,
            )
        if "\n" in self.command or "\r" in self.command:
            raise CkptError(
                f"--notify {self.command!r} is not one command line",
                "put several commands on one line (a; b), or in a script: --notify /path/notify.sh",
                ExitCode.USAGE,
            )
        parse_events(self.events)  # refuses a name that cannot notify
        if not self.timeout_s >= 0.1:
            raise CkptError(f"--notify-timeout {self.timeout_s:g} must be at least 0.1 s", "e.g. --notify-timeout 30", ExitCode.USAGE)

    def wants(self, event: str) -> bool:
        """Whether ``event`` is one this command is run for."""
        return event in self.events


@dataclass(frozen=True)
class JobContext:
    """Where an event happened: the job (``restart``: SLURM's requeue count), its directories and
    nodes (the allocation now), and the host of the batch script."""

    job_id: str
    restart: int
    ckpt_dir: str
    run_dir: str
    nodes: tuple[str, ...] = ()
    host: str = ""


def _names(value: str) -> list[str]:
    return [n for n in value.split(",") if n and n != "-"]


def _pairs(value: str) -> list[tuple[str, str]]:
    """``n2:n3,n4:n5`` (a replace's suspect:standby pairs) as pairs."""
    return [(p.partition(":")[0], p.partition(":")[2]) for p in value.split(",") if ":" in p]


def message(event: str, fields: Mapping[str, str], ctx: JobContext) -> str:
    """One line for people: what happened to which job, and whether it goes on."""
    job = f"job {ctx.job_id or '?'}"
    if event == "job_finished":
        return f"{job} finished: the training ended ({ctx.ckpt_dir})"
    if event == "job_failed":
        reason = fields.get("reason", "")
        words = _REASON_WORDS.get(reason, f"ckpt run exited with {fields.get('exit_code', '?')}")
        return f"{job} failed: {words} (exit {fields.get('exit_code', '?')}); not requeued ({ctx.ckpt_dir})"
    if event == "cancelled":
        return f"{job} cancelled ({fields.get('cause', 'scancel')}): checkpointing, then stopping; not requeued"
    if event == "job_stopped":
        return f"{job} stopped after its checkpoint ({fields.get('cause', 'scancel')}); not requeued: resume it with ckpt submit"
    if event == "max_requeues_reached":
        return (
            f"{job} stopped: max requeues reached ({fields.get('restarts', '?')} of {fields.get('limit', '?')}); resume it with ckpt submit"
        )
    if event == "requeue_failed":
        return f"{job} could not be requeued ({fields.get('reason', '?')}): it ends; resume it with ckpt submit"
    if event == "replaced":
        pairs = ", ".join(f"{a} with {b}" for a, b in _pairs(fields.get("replaced", "")))
        extra = [n for n in _names(fields.get("drop", "")) if n not in {a for a, _ in _pairs(fields.get("replaced", ""))}]
        also = f"; also left behind: {','.join(extra)}" if extra else ""
        return f"{job} replaced {pairs or '?'} (a hot spare took each slot){also}"
    if event == "nodes_left_behind":
        drop, keep = ",".join(_names(fields.get("drop", ""))) or "?", ",".join(_names(fields.get("keep", ""))) or "-"
        if fields.get("action") == "requeue":
            return f"{job} left {drop} behind: too few healthy nodes, requeued without them"
        return f"{job} left {drop} behind: going on with {keep}"
    if event == "requeue":
        return f"{job} requeued (restart {fields.get('restarts', '?')}): {fields.get('reason', '')}".rstrip(": ")
    return f"{job}: {event}"


def next_command(event: str, fields: Mapping[str, str], ctx: JobContext) -> str:
    """The command a user types next, quoted for a shell: the job's state, starts and last events."""
    return shlex.join(["ckpt", "status", ctx.ckpt_dir])


def payload(event: str, fields: Mapping[str, str], ctx: JobContext, time: float) -> dict[str, Any]:
    """The JSON object the command reads on stdin: ``event``, its fields (the chain's comma lists
    ``drop``/``keep``/``exclude`` as JSON lists), then ``job_id``, ``restart``, ``ckpt_dir``,
    ``run_dir``, ``nodes``, ``host``, ``time`` (seconds since the epoch), ``message`` and ``next``.
    A field named like one of those gives way to it."""
    data: dict[str, Any] = {"version": PAYLOAD_VERSION, "event": event}
    for key, value in fields.items():
        data[key] = _names(value) if key in _LIST_FIELDS else value
    data.update(
        job_id=ctx.job_id,
        restart=ctx.restart,
        ckpt_dir=ctx.ckpt_dir,
        run_dir=ctx.run_dir,
        nodes=list(ctx.nodes),
        host=ctx.host,
        time=time,
        message=message(event, fields, ctx),
        next=next_command(event, fields, ctx),
    )
    return data


def output_tail(output: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    """The end of a command's output, for an event: its last non-empty lines, at most ``limit`` characters, one line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    text = " | ".join(lines)
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def failure_detail(exit_code: int | None, output: str, timeout_s: float) -> str | None:
    """What a ``notify_failed`` event says, or ``None`` when the command succeeded (exit 0):
    ``exit N`` (``timed out after S s (killed)`` when ``exit_code`` is None), then its output's tail."""
    if exit_code == 0:
        return None
    what = f"timed out after {timeout_s:g} s (killed)" if exit_code is None else f"exit {exit_code}"
    tail = output_tail(output)
    return f"{what}: {tail}" if tail else what


def notify_env(config_env: Sequence[tuple[str, str]], config: NotifyConfig) -> tuple[tuple[str, str], ...]:
    """``--env`` pairs with the variables the batch script hands ``--notify`` to ``ckpt job`` by:
    ``CKPT_NOTIFY``, and ``CKPT_NOTIFY_ON``/``CKPT_NOTIFY_TIMEOUT`` when not the defaults. A
    ``--env CKPT_NOTIFY...`` given as well is a ``CkptError`` (exit 2)."""
    clash = [k for k, _ in config_env if k in ENV_NAMES]
    if clash:
        raise CkptError(
            f"--env {clash[0]} and --notify both set the notification command's values",
            "give --notify (and --notify-on, --notify-timeout), not --env CKPT_NOTIFY...",
            ExitCode.USAGE,
        )
    pairs = [(ENV_COMMAND, config.command)]
    if config.events != NOTIFY_EVENTS:
        pairs.append((ENV_EVENTS, ",".join(sorted(config.events))))
    if config.timeout_s != DEFAULT_TIMEOUT_S:
        pairs.append((ENV_TIMEOUT, f"{config.timeout_s:g}"))
    return (*config_env, *pairs)
