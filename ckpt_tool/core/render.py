"""Rendering the sbatch script. Pure: a frozen job spec in, the script text out.

Every value put into the script is shell-quoted (``shlex.quote``) here, in one place; the
template (``slurm_templates/train.sbatch.tmpl``, ``string.Template`` syntax) holds no logic beyond
the optional ``#SBATCH`` directives this module builds. Names that SLURM itself parses (job
name, partition...) are also refused when they hold characters SLURM would misread.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from string import Template

from ckpt_tool.core.launch_values import parse_mem, parse_time
from ckpt_tool.errors import CkptError, ExitCode

SLURM_WARNING_JITTER_S = 60  # slurmctld checks time limits every 30 s: the signal comes 30-60 s early
MIN_SIGNAL_LEAD_S = 120
_DIRECTIVE_VALUE = re.compile(r"^[A-Za-z0-9_.,:=+@%/\-\[\]]+$")
# --constraint has its own grammar: features joined by & (and), | (or), [..] (matching or),
# *N (counts), parentheses and ! (not), e.g. "a100&ib" or "[rack1|rack2]".
_CONSTRAINT_VALUE = re.compile(r"^[A-Za-z0-9_.,:=+@%/\-\[\]&|*()!]+$")


@dataclass(frozen=True)
class JobSpec:
    """Everything ``ckpt submit`` puts into the sbatch script: the training command, directories, the
    allocation and the supervisor's limits (seconds for ``signal_lead_s``). Raises ``CkptError`` (USAGE) at
    construction for an empty command, a count below 1, a ``--min-nodes`` outside ``1..nodes``, a bad time or
    memory, a name SLURM would misread, an invalid ``--env`` name or a newline in a path or directive."""

    command: tuple[str, ...]  # training script and args, or ("-m", module, ...)
    ckpt_dir: str
    run_dir: str
    ckpt: tuple[str, ...]  # how the node runs ckpt, e.g. ("/venv/bin/python", "-m", "ckpt_tool.cli.main")
    nodes: int = 1  # nodes that train (run ranks)
    min_nodes: int | None = None  # --nodes=MIN-MAX: the job may start and go on with fewer
    spares: int = 0  # hot spares: nodes allocated beside ``nodes`` that stand by to take a failed node's slot
    node_check: str | None = None  # pre-flight command for a standby (srun -w NODE bash -c CMD), exit 0 = healthy
    node_check_at_start: bool = False  # run node_check on every node at each job start
    node_check_timeout_s: int = 120
    suspect_after: int = 2
    straggler_suspect: bool = False  # ckpt run --straggler-suspect: a straggling node is left behind
    nproc_per_node: int = 1
    gpus_per_node: int = 0
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    job_name: str = "ckpt-train"
    signal_lead_s: int = MIN_SIGNAL_LEAD_S
    max_requeues: int = 10
    max_restarts: int = 3
    output: str | None = None  # default: RUN_DIR/slurm-%j.out
    extra_sbatch: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cpus_per_task: int | None = None
    mem: str | None = None
    version: str = ""
    created: str = ""
    extras: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise CkptError("no training command given", "usage: ckpt submit [OPTIONS] -- train.py ARGS", ExitCode.USAGE)
        for name in ("nodes", "nproc_per_node", "suspect_after"):
            if getattr(self, name) < 1:
                raise CkptError(f"--{name.replace('_', '-')} must be >= 1", "see `ckpt submit --help`", ExitCode.USAGE)
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise CkptError(
                f"--min-nodes {self.min_nodes} must be between 1 and --nodes {self.nodes}",
                f"e.g. --nodes {max(self.nodes, 2)} --min-nodes {max(self.nodes, 2) - 1}",
                ExitCode.USAGE,
            )
        if self.max_requeues < 0 or self.max_restarts < 0 or self.gpus_per_node < 0 or self.spares < 0:
            raise CkptError(
                "--max-requeues, --max-restarts, --gpus-per-node and --spares must be >= 0", "see `ckpt submit --help`", ExitCode.USAGE
            )
        if self.node_check is not None and (not self.node_check.strip() or "\n" in self.node_check or "\r" in self.node_check):
            raise CkptError(
                f"--node-check {self.node_check!r} is not one command line",
                "give a command on one line, e.g. --node-check 'dcgmi diag -r 1' or --node-check /path/check.sh",
                ExitCode.USAGE,
            )
        if self.node_check_at_start and self.node_check is None:
            raise CkptError(
                "--node-check-at-start needs --node-check CMD", "e.g. --node-check 'dcgmi diag -r 1' --node-check-at-start", ExitCode.USAGE
            )
        if self.node_check_timeout_s < 1:
            raise CkptError("--node-check-timeout must be >= 1 second", "e.g. --node-check-timeout 300", ExitCode.USAGE)
        for name, parse, example in (("time", parse_time, "--time 24:00:00 or --time 2-00:00:00"), ("mem", parse_mem, "--mem 64G")):
            value = getattr(self, name)
            try:
                parse(value) if value is not None else None
            except ValueError as exc:
                raise CkptError(f"--{name} {exc}", f"e.g. {example} (or its default in ckpt.toml / [tool.ckpt])", ExitCode.USAGE) from None
        for name in ("partition", "account", "qos", "job_name"):
            value = getattr(self, name)
            if value is not None and not _DIRECTIVE_VALUE.match(value):
                raise CkptError(
                    f"--{name.replace('_', '-')} {value!r} holds characters SLURM would misread",
                    "use letters, digits and . _ - , : = + @ % / [ ]",
                    ExitCode.USAGE,
                )
        if self.constraint is not None and not _CONSTRAINT_VALUE.match(self.constraint):
            raise CkptError(
                f"--constraint {self.constraint!r} holds characters SLURM would misread",
                "features with & | [ ] * ( ) !, letters, digits and . _ - , : = + @ % /, no spaces; e.g. --constraint 'a100&ib'",
                ExitCode.USAGE,
            )
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise CkptError("--cpus-per-task must be >= 1", "see `ckpt submit --help`", ExitCode.USAGE)
        for key, _ in self.env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise CkptError(f"--env {key!r} is not a valid variable name", "use NAME=VALUE", ExitCode.USAGE)
        for name in ("ckpt_dir", "run_dir", "output"):
            value = getattr(self, name)
            if value is not None and ("\n" in value or "\r" in value):
                raise CkptError(f"{name.replace('_', '-')} {value!r} holds a newline", "use a path without line breaks", ExitCode.USAGE)
        for line in self.extra_sbatch:
            if "\n" in line or "\r" in line:
                raise CkptError("an extra #SBATCH line holds a newline", "give one directive per --sbatch option", ExitCode.USAGE)

    @property
    def world_size(self) -> int:
        """Ranks at the full allocation: ``nodes x nproc_per_node`` (fewer when a ``min_nodes`` job shrinks)."""
        return self.nodes * self.nproc_per_node

    @property
    def nodes_range(self) -> str:
        """``--nodes`` for sbatch: the training nodes and the spares, MIN-MAX when the job may run on fewer."""
        total = self.nodes + self.spares
        low = self.min_nodes or total
        return f"{low}-{total}" if low < total else str(total)


def option_value(argv: Sequence[str], option: str) -> str | None:
    """The value of ``option`` in a command line (``--opt VALUE`` or ``--opt=VALUE``; the last wins)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(option + "="):
            found = arg[len(option) + 1 :]
    return found


def signal_lead(checkpoint_seconds: float | None) -> int:
    """Seconds before the time limit to ask for the final checkpoint: twice the last measured
    checkpoint time plus SLURM's 30-60 s warning jitter, at least 2 minutes."""
    if checkpoint_seconds is None:
        return 300
    return max(MIN_SIGNAL_LEAD_S, math.ceil(2 * checkpoint_seconds) + SLURM_WARNING_JITTER_S)


def directives(spec: JobSpec) -> list[str]:
    """The script's ``#SBATCH`` lines for ``spec``: the fixed ones (requeue, append, the
    USR1 warning ``signal_lead_s`` before the limit, the output path quoted), the options given, then
    ``extra_sbatch`` verbatim."""
    q = shlex.quote
    out = [
        f"#SBATCH --job-name={spec.job_name}",
        f"#SBATCH --nodes={spec.nodes_range}",
        # With a node range, --ntasks-per-node=1 makes SLURM count MIN tasks and allocate MIN nodes
        # (measured); without it the job gets up to MAX, each with --cpus-per-task.
        *(["#SBATCH --ntasks-per-node=1"] if "-" not in spec.nodes_range else []),
        # With a node range or spares, a failed node must not end the job: it goes on with the others.
        *(["#SBATCH --no-kill"] if "-" in spec.nodes_range or spec.spares else []),
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --signal=B:USR1@{spec.signal_lead_s}",
        f"#SBATCH --output={q(spec.output or spec.run_dir + '/slurm-%j.out')}",
    ]
    optional = {
        "time": spec.time,
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "constraint": spec.constraint,
        "mem": spec.mem,
        "cpus-per-task": spec.cpus_per_task,
        "gpus-per-node": spec.gpus_per_node or None,
    }
    out += [f"#SBATCH --{k}={v}" for k, v in optional.items() if v is not None]
    out += [line if line.startswith("#SBATCH") else f"#SBATCH {line}" for line in spec.extra_sbatch]
    return out


def follow_up_commands(job_id: str, ckpt_dir: str) -> dict[str, str]:
    """What to run after a submit, each quoted as a shell needs it (a path with spaces or quotes
    pastes as one argument)."""
    return {
        "status": shlex.join(["ckpt", "status", ckpt_dir]),
        "queue": shlex.join(["squeue", "-j", job_id]),
        "history": shlex.join(["ckpt", "history", ckpt_dir]),
    }


def node_options(spec: JobSpec) -> str:
    """``ckpt job``'s hot-spare options for ``spec`` (none without spares or a node check), quoted."""
    q = shlex.quote
    words = [f"--train-nodes {int(spec.nodes)}"] if spec.spares else []
    if spec.node_check is not None:
        words += [f"--node-check {q(spec.node_check)}", f"--node-check-timeout {int(spec.node_check_timeout_s)}"]
        words += ["--node-check-at-start"] if spec.node_check_at_start else []
    return "".join(" " + w for w in words)


def render(spec: JobSpec, template: str) -> str:
    """The sbatch script: ``template`` (``string.Template``) filled with ``spec``'s directives and shell-quoted
    values. Raises ``KeyError`` or ``ValueError`` for a template with a placeholder it does not fill."""
    q = shlex.quote
    values = {
        "directives": "\n".join(directives(spec)),
        "version": spec.version,
        "created": spec.created,
        "ckpt": " ".join(q(a) for a in spec.ckpt),
        "ckpt_dir": q(spec.ckpt_dir),
        "run_dir": q(spec.run_dir),
        "max_requeues": str(int(spec.max_requeues)),
        "max_restarts": str(int(spec.max_restarts)),
        "nproc_per_node": str(int(spec.nproc_per_node)),
        "min_nodes": str(int(spec.min_nodes or spec.nodes)),
        "suspect_after": str(int(spec.suspect_after)),
        "straggler_suspect": " --straggler-suspect" if spec.straggler_suspect else "",
        "node_options": node_options(spec),
        "command": " ".join(q(a) for a in spec.command),
        "env": "\n".join(f"export {k}={q(v)}" for k, v in spec.env),
    }
    return Template(template).substitute(values)
