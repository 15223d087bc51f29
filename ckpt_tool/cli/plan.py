"""``ckpt plan``: a checkpoint interval from numbers (Young/Daly), not habit."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ckpt_tool.core.interval import plan_interval, waste_table
from ckpt_tool.errors import CkptError, ExitCode

console = Console()


def _step_seconds(run_dir: Path) -> float | None:
    """Median step duration `ckpt run` observed in this run directory."""
    try:
        steps = json.loads((run_dir / "timeouts.json").read_text())["durations"].get("step") or []
    except (FileNotFoundError, ValueError, KeyError, AttributeError):
        return None
    steps = [s for s in steps if s > 0.001]  # phase switches inside a step record near-zero spans
    return statistics.median(steps) if steps else None


def plan(
    ckpt_seconds: float = typer.Option(..., "--ckpt-seconds", help="Seconds one checkpoint costs the training (blocked time)."),
    mtbf_hours: Optional[float] = typer.Option(None, "--mtbf-hours", help="Mean time between failures of the whole job."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="GPUs in the job (with --gpu-mtbf-hours)."),
    gpu_mtbf_hours: Optional[float] = typer.Option(None, "--gpu-mtbf-hours", help="MTBF of one GPU (with its host share)."),
    restart_seconds: float = typer.Option(0.0, "--restart-seconds", help="Seconds from a failure to training again (detection, restart, load)."),
    step_seconds: Optional[float] = typer.Option(None, "--step-seconds", help="Seconds per training step (default: measured in --run-dir)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="A `ckpt run` directory: its measured step time converts the interval into steps."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Recommend a checkpoint interval (Young/Daly) and show goodput and waste per day around it."""
    if (mtbf_hours is None) == (gpus is None or gpu_mtbf_hours is None):
        raise CkptError("give either --mtbf-hours, or --gpus with --gpu-mtbf-hours", "e.g. ckpt plan --ckpt-seconds 90 --gpus 512 --gpu-mtbf-hours 50000", ExitCode.USAGE)
    mtbf_s = (mtbf_hours if mtbf_hours is not None else gpu_mtbf_hours / gpus) * 3600  # type: ignore[operator]
    if step_seconds is None and run_dir is not None:
        step_seconds = _step_seconds(run_dir)
    p = plan_interval(ckpt_seconds, mtbf_s, restart_seconds, step_seconds)
    if as_json:
        sys.stdout.write(json.dumps({"interval_seconds": round(p.interval_s, 3), "interval_steps": p.interval_steps, "expected_goodput": round(p.goodput, 6), "young_seconds": round(p.young_s, 3), "mtbf_seconds": mtbf_s}) + "\n")
        return
    steps = f" = {p.interval_steps} steps of {p.step_s:.3g} s" if p.interval_steps else ""
    console.print(f"checkpoint every [bold]{p.interval_s / 60:.1f} min[/] of training{steps} (Young: {p.young_s / 60:.1f} min); expected goodput {p.goodput:.1%}")
    table = Table(title=f"MTBF {mtbf_s / 3600:.2f} h, checkpoint {ckpt_seconds:g} s, restart {restart_seconds:g} s")
    for col in ("interval", "goodput", "waste h/day", ""):
        table.add_column(col, justify="right" if col else "left")
    rows = waste_table(p)
    worst = max(r[2] for r in rows) or 1.0
    for tau, g, waste in rows:
        bar = "#" * max(1, round(30 * waste / worst))
        table.add_row(f"{tau / 60:.1f} min" + (" *" if tau == p.interval_s else ""), f"{g:.2%}", f"{waste:.2f}", bar)
    console.print(table)
