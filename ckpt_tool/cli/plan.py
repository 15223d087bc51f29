"""``ckpt plan``: a checkpoint interval from numbers (Young/Daly), not habit."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import typer

from ckpt_tool.cli.output import Column, out, print_json, print_table
from ckpt_tool.core.interval import DAY_S, IntervalPlan, TwoTierPlan, plan_interval, plan_two_tier, waste_table
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
    local_seconds: float | None = typer.Option(
        None, "--local-seconds", help="With a fast tier: seconds one node-local save costs the training (models both tiers)."
    ),
    local_restart_seconds: float | None = typer.Option(
        None, "--local-restart-seconds", help="Seconds from a failure to training again from the fast tier (default: --restart-seconds)."
    ),
    local_covers: float = typer.Option(
        0.9, "--local-covers", help="Share of failures the fast tier recovers (those that take no more nodes than it has copies)."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Recommend a checkpoint interval (Young/Daly) and show goodput and waste per day around it;
    with --local-seconds, the intervals of a fast tier and the shared one and what the fast tier buys."""
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
        ("--local-seconds", local_seconds),
    ):
        _positive(option, value)
    _positive("--restart-seconds", restart_seconds, allow_zero=True)
    _positive("--local-restart-seconds", local_restart_seconds, allow_zero=True)
    if step_seconds is not None and run_dir is not None:
        raise CkptError(
            "--step-seconds and --run-dir exclude each other", "give the step time, or the run directory to measure it from", ExitCode.USAGE
        )
    mtbf_s = (mtbf_hours if mtbf_hours is not None else gpu_mtbf_hours / gpus) * 3600  # type: ignore[operator]
    if run_dir is not None:
        step_seconds = _step_seconds(run_dir)
    if local_seconds is not None:
        local_restart = restart_seconds if local_restart_seconds is None else local_restart_seconds
        _print_two_tier(
            plan_two_tier(ckpt_seconds, local_seconds, mtbf_s, restart_seconds, local_restart, local_covers, step_seconds), as_json
        )
        return
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


def _every(p: IntervalPlan) -> str:
    steps = f" = {p.interval_steps} steps" if p.interval_steps else ""
    return f"{p.interval_s / 60:.1f} min{steps}"


def _print_two_tier(t: TwoTierPlan, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "local_interval_seconds": round(t.local.interval_s, 3),
                "local_interval_steps": t.local.interval_steps,
                "shared_interval_seconds": round(t.shared.interval_s, 3),
                "shared_interval_steps": t.shared.interval_steps,
                "expected_goodput": round(t.goodput, 6),
                "shared_only": {
                    "interval_seconds": round(t.shared_only.interval_s, 3),
                    "interval_steps": t.shared_only.interval_steps,
                    "expected_goodput": round(t.shared_only.goodput, 6),
                },
                "local_covers": t.covered,
            }
        )
        return
    gain = (t.goodput - t.shared_only.goodput) * DAY_S / 3600
    out.print(
        f"fast tier every [bold]{_every(t.local)}[/], shared tier every [bold]{_every(t.shared)}[/]: expected goodput {t.goodput:.2%} "
        f"(shared tier alone, every {_every(t.shared_only)}: {t.shared_only.goodput:.2%}); the fast tier buys {(t.goodput - t.shared_only.goodput) * 100:.2f} points: {gain:.2f} h of every GPU's day"
    )
    print_table(
        [
            Column("plan"),
            Column("interval", justify="right"),
            Column("MTBF it meets", "mtbf", justify="right"),
            Column("goodput", justify="right"),
        ],
        [
            (f"fast tier ({t.covered:.0%} of failures)", _every(t.local), f"{t.local.mtbf_s / 3600:.2f} h", f"{t.local.goodput:.2%}"),
            ("shared tier (the rest)", _every(t.shared), f"{t.shared.mtbf_s / 3600:.2f} h", f"{t.shared.goodput:.2%}"),
            ("shared tier alone", _every(t.shared_only), f"{t.shared_only.mtbf_s / 3600:.2f} h", f"{t.shared_only.goodput:.2%}"),
        ],
        title=f"checkpoint {t.shared_only.checkpoint_s:g} s shared / {t.local.checkpoint_s:g} s local, restart {t.shared_only.restart_s:g} s / {t.local.restart_s:g} s",
    )
