"""``ckpt replay CKPT_DIR --from STEP [--steps K] [-- COMMAND]``: run the training again from a
checkpoint and compare it with the run's record (``ops.replay``). Parse, call, print."""

from __future__ import annotations

from pathlib import Path

import typer

from ckpt_tool.cli.options import DirArg, JsonOpt
from ckpt_tool.cli.output import err, escape, out, print_json
from ckpt_tool.cli.targets import open_checkpoints, resolve_step, run_dir_for
from ckpt_tool.errors import ExitCode


def replay(
    directory: Path = DirArg,
    command: list[str] = typer.Argument(
        None,
        metavar="[-- COMMAND]",
        help="The training command (default: the one ckpt run recorded in the run directory).",
        show_default=False,
    ),
    from_step: int | None = typer.Option(None, "--from", help="The checkpoint to start from (default: the one LATEST names)."),
    steps: int = typer.Option(5, "--steps", help="How many steps to replay after it."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="The run's directory, its record (default: CKPT_DIR/run)."),
    work: Path | None = typer.Option(
        None, "--work", help="Where the copy and the replay's output go (default: a new temporary directory)."
    ),
    keep: bool = typer.Option(False, "--keep", metavar="", help="Keep the work directory (default: removed when the steps match)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds the replay may take."),
    as_json: bool = JsonOpt,
) -> None:
    """Run the training again from a checkpoint and compare each rank's values with the run's record, bit for bit.

    Answers "were steps S+1..S+K computed the same way again?" (a node under suspicion, a result to
    stand behind): "bit-identical to the record", or the first step, rank and value that differ.
    The checkpoint directory is only read: the replay runs on a copy of step S at its world size,
    on this machine. Exit 0: identical; 1: a step differs (or the training failed); 2/3: see the message.
    """
    import shutil

    from ckpt_tool.ops.replay import replay as run_replay

    store = open_checkpoints(directory)
    step = resolve_step(store, from_step)
    done = run_replay(store, step, steps, run_dir_for(run_dir, directory), tuple(command or ()), work, timeout)
    c = done.comparison
    keep = keep or work is not None or not c.identical
    if as_json:
        print_json({**c.to_json(), "command": list(done.command), "cwd": done.cwd, "world_size": done.world_size,
                    "work": str(done.work) if keep else None, "log": str(done.log) if keep else None, "written_again": list(done.outside)})  # fmt: skip
    else:
        out.print(escape(c.message()))
        out.print(f"ran: {escape(' '.join(done.command))} ({done.world_size} ranks, in {escape(done.cwd)})")
        if keep:
            out.print(f"the replay's copy, record and output: {escape(str(done.work))} (log: {escape(str(done.log))})")
        for path in done.outside:
            err.print(
                f"[yellow]note:[/] the command names {escape(path)}: the replay wrote there too (give -- COMMAND to point it elsewhere)"
            )
    if not keep:
        shutil.rmtree(done.work, ignore_errors=True)
    if not c.identical:
        raise typer.Exit(ExitCode.FAILED)
