"""``ckpt run``: parse, build the run configuration, supervise, print."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.live import Live

from ckpt_tool.core.timeouts import PHASES, TimeoutPolicy
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.supervise.watchdog import RunConfig, Watchdog

console = Console(stderr=True)


def _parse_timeouts(values: list[str]) -> dict[str, float]:
    out = {}
    for value in values:
        phase, sep, seconds = value.partition("=")
        try:
            number = float(seconds)
        except ValueError:
            number = -1.0
        if not sep or phase not in PHASES or number <= 0:
            raise CkptError(f"--timeout {value!r} is not PHASE=SECONDS with a positive number", f"phases: {', '.join(PHASES)}; e.g. --timeout step=30", ExitCode.USAGE)
        out[phase] = number
    return out


def run(
    command: List[str] = typer.Argument(..., help="The training script and its arguments (after --), or -m MODULE ARGS.", show_default=False),
    nproc_per_node: int = typer.Option(1, "--nproc-per-node", min=1, help="Ranks on this node."),
    nnodes: str = typer.Option("1", "--nnodes", help="Nodes, or MIN:MAX (torchrun syntax)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the rendezvous (multi-node)."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", help="Rendezvous id (the SLURM job id under `ckpt submit`)."),
    max_restarts: int = typer.Option(3, "--max-restarts", min=0, help="Restarts in the same allocation after a crash or hang."),
    crash_loop: int = typer.Option(3, "--crash-loop", min=1, help="Stop after this many failures in a row without a new checkpoint."),
    run_dir: Path = typer.Option(Path("ckpt-run"), "--run-dir", help="Event log and calibrated timeouts (kept across restarts)."),
    timeout: List[str] = typer.Option([], "--timeout", help="Override a phase timeout: PHASE=SECONDS (repeatable)."),
    grace: float = typer.Option(5.0, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL when tearing ranks down."),
    stop_deadline: float = typer.Option(300.0, "--stop-deadline", min=1, help="Seconds to wait for the checkpoint after SIGUSR1/SIGTERM."),
) -> None:
    """Run torchrun under a watchdog: crashes and hangs detected in seconds, restarts from the newest checkpoint.

    Exit codes: 0 finished; 1 failed (restarts exhausted); 2 usage; 75 stopped after a checkpoint
    on SIGUSR1/SIGTERM (requeue me); 76 crash loop (no progress, not restarted again).
    """
    cfg = RunConfig(
        command=tuple(command),
        run_dir=run_dir,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        crash_loop=crash_loop,
        grace_s=grace,
        stop_deadline_s=stop_deadline,
        timeouts=TimeoutPolicy(overrides=_parse_timeouts(timeout)),
    )
    if sys.stderr.isatty():
        with Live(console=console, refresh_per_second=2, transient=True) as live:
            code = Watchdog(cfg, report=live.console.print, status=lambda s: live.update(_status_line(s))).run()
    else:
        code = Watchdog(cfg, report=lambda line: print(line, file=sys.stderr, flush=True)).run()
    raise typer.Exit(code)


def _status_line(status: dict[str, Any]) -> str:
    ranks = "  ".join(f"r{r}: step {step} {phase} {ago:.1f}s" for r, (step, phase, ago) in status["ranks"].items())
    return f"[bold]ckpt run[/] attempt {status['attempt']}  checkpoint {status['ckpt']}  {ranks or 'starting...'}"
