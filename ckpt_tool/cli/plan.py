"""``ckpt plan``: a checkpoint interval from numbers (Young/Daly), not habit."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import typer

from ckpt_tool.cli.output import Column, out, print_json, print_table
from ckpt_tool.core.interval import plan_interval, waste_table
from ckpt_tool.errors import CkptError, ExitCode


def _positive(option: str, value: float | None, allow_zero: bool = False) -> None:
    """Refuse a value the user typed, naming the option and the value as typed."""
    if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)):
        raise CkptError(
            f"{option} must be a {'non-negative' if allow_zero else 'positive'} number, got {value:g}",
            "see `ckpt plan --help`",
            ExitCode.USAGE,
        )


def _step_seconds(run_dir: Path) -> float:
    """Median step duration `ckpt run` observed in this run directory."""
    from ckpt_tool.supervise.durations import DURATIONS_NAME, read_durations

    if not run_dir.is_dir():
        raise CkptError(
            f"--run-dir {run_dir} is not a directory",
            "pass the run directory of `ckpt run` (CKPT_DIR/run), or --step-seconds",
            ExitCode.NOT_FOUND,
        )
    durations = read_durations(run_dir)
    steps = [s for s in (durations.durations.get("step", []) if durations else []) if s > 0.001]  # phase switches record near-zero spans
    if not steps:
        raise CkptError(
            f"{run_dir} holds no measured step time ({DURATIONS_NAME} missing or without steps)",
            "run the job under `ckpt run` first, or give --step-seconds",
            ExitCode.NOT_FOUND,
        )
    return statistics.median(steps)


def plan(
    ckpt_seconds: float = typer.Option(..., "--ckpt-seconds", help="Seconds one checkpoint costs the training (blocked time)."),
    mtbf_hours: float | None = typer.Option(None, "--mtbf-hours", help="Mean time between failures of the whole job."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs in the job (with --gpu-mtbf-hours)."),
    gpu_mtbf_hours: float | None = typer.Option(None, "--gpu-mtbf-hours", help="MTBF of one GPU (with its host share)."),
    restart_seconds: float = typer.Option(
        0.0, "--restart-seconds", help="Seconds from a failure to training again (detection, restart, load)."
    ),
    step_seconds: float | None = typer.Option(None, "--step-seconds", help="Seconds per training step (default: measured in --run-dir)."),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="A `ckpt run` directory: its measured step time converts the interval into steps."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Recommend a checkpoint interval (Young/Daly) and show goodput and waste per day around it."""
    if (mtbf_hours is None) == (gpus is None or gpu_mtbf_hours is None):
        raise CkptError(
            "give either --mtbf-hours, or --gpus with --gpu-mtbf-hours",
            "e.g. ckpt plan --ckpt-seconds 90 --gpus 512 --gpu-mtbf-hours 50000",
            ExitCode.USAGE,
        )
    for option, value in (
        ("--ckpt-seconds", ckpt_seconds),
        ("--mtbf-hours", mtbf_hours),
        ("--gpu-mtbf-hours", gpu_mtbf_hours),
        ("--step-seconds", step_seconds),
    ):
        _positive(option, value)
    _positive("--restart-seconds", restart_seconds, allow_zero=True)
    if step_seconds is not None and run_dir is not None:
        raise CkptError(
            "--step-seconds and --run-dir exclude each other", "give the step time, or the run directory to measure it from", ExitCode.USAGE
        )
    mtbf_s = (mtbf_hours if mtbf_hours is not None else gpu_mtbf_hours / gpus) * 3600  # type: ignore[operator]
    if run_dir is not None:
        step_seconds = _step_seconds(run_dir)
    p = plan_interval(ckpt_seconds, mtbf_s, restart_seconds, step_seconds)
    if as_json:
        print_json(
            {
                "interval_seconds": round(p.interval_s, 3),
                "interval_steps": p.interval_steps,
                "step_seconds": step_seconds,
                "expected_goodput": round(p.goodput, 6),
                "young_seconds": round(p.young_s, 3),
                "mtbf_seconds": mtbf_s,
            }
        )
        return
    steps = f" = {p.interval_steps} steps of {p.step_s:.3g} s" if p.interval_steps else ""
    out.print(
        f"checkpoint every [bold]{p.interval_s / 60:.1f} min[/] of training{steps} (Young: {p.young_s / 60:.1f} min); expected goodput {p.goodput:.1%}"
    )
    rows = waste_table(p)
    worst = max(r[2] for r in rows) or 1.0
    print_table(
        [
            Column("interval", justify="right"),
            Column("goodput", justify="right"),
            Column("waste h/day", "waste_hours_per_day", justify="right"),
            Column("", "bar"),
        ],
        [
            (
                f"{tau / 60:.1f} min" + (" *" if tau == p.interval_s else ""),
                f"{g:.2%}",
                f"{waste:.2f}",
                "#" * max(1, round(30 * waste / worst)),
            )
            for tau, g, waste in rows
        ],
        title=f"MTBF {mtbf_s / 3600:.2f} h, checkpoint {ckpt_seconds:g} s, restart {restart_seconds:g} s",
    )
