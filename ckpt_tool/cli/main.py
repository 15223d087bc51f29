"""The ``ckpt`` executable: the batch script's own calls answered at once, everything else by
the whole CLI (``ckpt_tool.cli.app``).

The sbatch script calls ``ckpt note`` and ``ckpt free-port`` on the path from SLURM's signal to
the next step trained (a requeue notes it, every start notes it and picks a rendezvous port).
The whole CLI (typer, rich, the checkpoint store) takes ~0.4 s to start on a 2-core node; these
two need ~0.07 s. Only the exact shape the script uses is answered here: any other shape
(``--help``, ``--debug``, a missing argument, an option) goes to the whole CLI, which parses it
and reports errors as every other command does. Both paths call the same functions.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def parse_fields(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` words as a dict (a word without ``=`` is a key with an empty value)."""
    return dict(item.partition("=")[::2] for item in items)


def note(run_dir: Path, event: str, items: list[str]) -> None:
    """Append ``event`` with its ``KEY=VALUE`` fields to the run's event log."""
    from ckpt_tool.errors import CkptError, ExitCode
    from ckpt_tool.supervise.run_dir import EVENTS_NAME
    from ckpt_tool.supervise.run_dir import note as append_event

    try:
        append_event(run_dir, event, **parse_fields(items))
    except OSError as exc:
        raise CkptError(
            f"cannot append to {run_dir / EVENTS_NAME}: {exc.strerror or exc}",
            "give a run directory this user can create and write (the job's --run-dir, by default CKPT_DIR/run)",
            ExitCode.USAGE,
        ) from None


def answered_at_once(args: list[str]) -> bool:
    """Whether ``args`` is one of the batch script's calls in the shape it uses them."""
    if os.environ.get("CKPT_DEBUG") == "1" or any(a.startswith("-") for a in args):
        return False
    return args == ["free-port"] or (len(args) >= 3 and args[0] == "note" and all(args[1:3]))


def main(argv: list[str] | None = None) -> None:
    """Run ``ckpt ARGS``; exits (SystemExit) with the command's exit code, as the whole CLI does."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not answered_at_once(args):
        from ckpt_tool.cli.app import main as whole_cli

        whole_cli(args)
    if args[0] == "free-port":  # for jobs queued with the script before `ckpt job`
        from ckpt_tool.slurm.job import free_port

        print(free_port())
        sys.exit(0)
    from ckpt_tool.errors import CkptError

    try:
        note(Path(args[1]), args[2], args[3:])
    except CkptError as exc:  # worded as the whole CLI words it, without rich
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    sys.exit(0)


if __name__ == "__main__":
    main()
