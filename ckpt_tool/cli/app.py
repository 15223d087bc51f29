"""The ``ckpt`` command's whole CLI: wiring only. Each command group lives in its own module;
``ckpt_tool.cli.main`` is the executable (it answers the batch script's own calls without this).

Errors are turned into messages in one place (``main``): a ``CkptError`` prints its message and
hint and exits with its code; ``--debug`` (or CKPT_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from ckpt_tool import __version__
from ckpt_tool.cli import changes, checkpoints, contents_commands, demo, jobs, nodes, plan, replay, runs
from ckpt_tool.cli.help import Command, Group
from ckpt_tool.cli.output import print_error
from ckpt_tool.errors import CkptError

EXIT_CODES = (
    "[bold]Exit codes[/]\n\n"
    "0 success · 1 a check failed (damage found) or the run failed · 2 bad command line or input · "
    "3 no checkpoint directory, step or valid checkpoint · 4 the checkpoint does not fit the run "
    "(world size, format version, model) or another job holds the directory · "
    "5 (`ckpt verify`) nothing to verify: saved without a probe · "
    "75 (`ckpt run`) stopped after a checkpoint on request: requeue · 76 (`ckpt run`) crash loop · "
    "77 (`ckpt run`) a node keeps failing: the round ended so that the job can leave it behind · "
    "78 saves failed (disk full, read-only, I/O error) max_failed_saves times in a row or at the final save; "
    "the previous checkpoint is intact and `ckpt run` does not restart · "
    "79 a wrong value (NaN, infinity, replicas that part) that the replay from the checkpoint reproduced: "
    "the data or the model, not the hardware; not restarted\n\n"
    "Add --debug anywhere among ckpt's own options for a traceback instead of a message; "
    "options after `--` belong to the training command."
)

app = typer.Typer(
    name="ckpt",
    help="Checkpointing and fault recovery for distributed PyTorch training on SLURM.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    cls=Group,
)
app.command("demo", cls=Command)(demo.demo)
app.command("list", cls=Command)(checkpoints.list_checkpoints)
app.command("validate", cls=Command)(checkpoints.validate)
app.command("verify", cls=Command)(checkpoints.verify)
app.command("export", cls=Command)(contents_commands.export)
app.command("inspect", cls=Command)(contents_commands.inspect)
app.command("diff", cls=Command)(contents_commands.diff)
app.command("du", cls=Command)(contents_commands.du)
app.add_typer(contents_commands.quarantine_app, name="quarantine")
app.command("rollback", cls=Command)(changes.rollback)
app.command("prune", cls=Command)(changes.prune)
app.command("reshard", cls=Command)(changes.reshard)
app.command("adopt", cls=Command)(changes.adopt)
# Commands whose trailing words are the training command: ckpt's options end at its first word.
PASSTHROUGH = {"run": jobs.run, "submit": jobs.submit}
for _name, _fn in PASSTHROUGH.items():
    app.command(_name, context_settings={"allow_interspersed_args": False}, cls=Command)(_fn)
app.command("replay", cls=Command)(replay.replay)  # its options come first or anywhere: the command follows --
app.command("recover", cls=Command)(jobs.recover)
app.command("job", cls=Command)(jobs.job)
app.command("note", hidden=True, cls=Command)(jobs.note_cmd)
app.command("free-port", hidden=True, cls=Command)(jobs.free_port)
app.command("nodes", cls=Command)(nodes.nodes)
app.command("status", cls=Command)(runs.status)
app.command("history", cls=Command)(runs.history)
app.command("stacks", cls=Command)(runs.stacks)
app.command("plan", cls=Command)(plan.plan)


def _print_version(value: bool) -> None:
    if value:
        print(f"ckpt-tool {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show a traceback instead of a message (CKPT_DEBUG=1 does the same)."),
) -> None:
    """Checkpointing and fault recovery for distributed PyTorch training on SLURM."""


def split_debug(args: list[str]) -> tuple[list[str], bool]:
    """Take ``--debug`` out of ckpt's own options, wherever they are; never out of the training
    command of ``ckpt run`` / ``ckpt submit`` (after ``--``, or after its first word when the
    command has no ``--``: those words belong to the user's script)."""
    group: Any = typer.main.get_command(app)  # a click-style group (typer vendors click)
    out: list[str] = []
    debug = False
    command: str | None = None
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return out + args[i:], debug
        if token == "--debug":
            debug = True
            i += 1
            continue
        out.append(token)
        i += 1
        if token.startswith("-"):
            params = (group.commands[command] if command else group).params
            name = token.split("=", 1)[0]
            takes_value = any(p.param_type_name == "option" and name in p.opts and not p.is_flag and not p.count for p in params)
            if takes_value and "=" not in token and i < len(args):
                out.append(args[i])
                i += 1
        elif command is None:
            command = token if token in group.commands else None
        elif command in PASSTHROUGH:
            return out + args[i:], debug  # the training command starts here
    return out, debug


def main(argv: list[str] | None = None) -> None:
    """The ``ckpt`` executable: run the CLI on ``argv`` (the process's arguments when None). A ``CkptError``
    prints its message and hint on stderr and exits with its code; ``--debug`` or ``CKPT_DEBUG=1`` raises
    it with its traceback instead. Ends in ``SystemExit`` (Typer exits itself; usage errors exit 2)."""
    args, debug = split_debug(list(sys.argv[1:] if argv is None else argv))
    debug = debug or os.environ.get("CKPT_DEBUG") == "1"
    try:
        app(args=args, prog_name="ckpt")  # exits itself: usage errors exit 2
    except CkptError as exc:
        if debug:
            raise
        print_error(exc)
        sys.exit(exc.exit_code)
