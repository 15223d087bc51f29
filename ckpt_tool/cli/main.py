"""The ``ckpt`` command: wiring only. Each command group lives in its own module.

Errors are turned into messages in one place (``main``): a ``CkptError`` prints its message and
hint and exits with its code; ``--debug`` (or CKPT_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from ckpt_tool.cli import checkpoints, demo, jobs, plan
from ckpt_tool.errors import CkptError

app = typer.Typer(
    name="ckpt",
    help="Checkpointing and fault recovery for distributed PyTorch training on SLURM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("demo")(demo.demo)
app.command("list")(checkpoints.list_checkpoints)
app.command("validate")(checkpoints.validate)
app.command("verify")(checkpoints.verify)
app.command("rollback")(checkpoints.rollback)
app.command("prune")(checkpoints.prune)
app.command("reshard")(checkpoints.reshard)
app.command("run", context_settings={"allow_interspersed_args": False})(jobs.run)
app.command("submit", context_settings={"allow_interspersed_args": False})(jobs.submit)
app.command("recover")(jobs.recover)
app.command("note", hidden=True)(jobs.note_cmd)
app.command("status")(jobs.status)
app.command("history")(jobs.history)
app.command("plan")(plan.plan)


@app.callback()
def root() -> None:
    """Checkpointing and fault recovery for distributed PyTorch training on SLURM.

    Exit codes: 0 ok; 1 a check or run failed; 2 bad command line or input; 3 no checkpoint
    directory or no valid checkpoint; 4 the checkpoint does not fit the run (world size,
    format version, lock held). Add --debug for a traceback.
    """

err_console = Console(stderr=True)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("CKPT_DEBUG") == "1"
    if "--debug" in args:
        args.remove("--debug")
        debug = True
    try:
        app(args=args, prog_name="ckpt")  # exits itself: usage errors exit 2
    except CkptError as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
        if exc.hint:
            err_console.print(f"[yellow]hint:[/] {exc.hint}", highlight=False)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
