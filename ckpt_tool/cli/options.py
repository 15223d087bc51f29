"""The option and argument declarations several ``ckpt`` commands share, declared once: the
checkpoint directory argument, ``--json``, ``--step`` and ``--run-dir``. Each command keeps its
own help text where the commands differ in what the option does for them."""

from __future__ import annotations

from typing import Any

import typer

from ckpt_tool.core import layout

DirArg = typer.Argument(..., metavar="DIR", help="The checkpoint directory.", show_default=False)
"""The checkpoint directory every command that reads or changes one takes first."""


def json_option(help: str) -> Any:
    """``--json``: the command prints one JSON document on stdout instead of its human output."""
    return typer.Option(False, "--json", help=help)


JsonOpt = json_option("Print JSON instead of tables.")
"""``--json`` of the commands about a checkpoint directory (list, validate, verify, export, ...)."""
JsonTextOpt = json_option("Print JSON instead of text.")
"""``--json`` of the commands about a run or a job (submit, recover, status, history, nodes, plan)."""


def step_option(help: str, default: int | None = None) -> Any:
    """The one ``--step`` option of every command: a step number in [0, MAX_STEP] (a checkpoint's
    directory name has 8 digits); anything else is refused by the parser with exit 2."""
    return typer.Option(default, "--step", min=0, max=layout.MAX_STEP, help=help)


def run_dir_option(help: str) -> Any:
    """``--run-dir``: the run directory, when it is not the default ``CKPT_DIR/run``
    (:func:`ckpt_tool.cli.targets.run_dir_for`); ``help`` says what the command reads or writes there."""
    return typer.Option(None, "--run-dir", help=help)


NodeCheckOpt = typer.Option(
    None,
    "--node-check",
    help="Pre-flight command a standby must pass (exit 0) before it takes a slot, run on the node with "
    "`srun -w NODE bash -c CMD` (e.g. 'dcgmi diag -r 1' or a script of yours); a standby that fails is left behind.",
)
"""``--node-check CMD`` of ``ckpt submit`` (put into the script) and ``ckpt job`` (run by the chain)."""
NodeCheckAtStartOpt = typer.Option(False, "--node-check-at-start", help="Also run --node-check on every node at each job start.")
"""``--node-check-at-start`` of ``ckpt submit`` and ``ckpt job``."""
NodeCheckTimeoutOpt = typer.Option(120, "--node-check-timeout", min=1, help="Seconds before a node check counts as failed (it is killed).")
"""``--node-check-timeout`` of ``ckpt submit`` and ``ckpt job``."""
