"""``ckpt plan``: a checkpoint interval from numbers (Young/Daly), not habit."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from ckpt_tool.cli.options import JsonTextOpt, run_dir_option
from ckpt_tool.cli.output import Column, escape, out, print_json, print_table
from ckpt_tool.core.interval import (
    DAY_S,
    MIN_GOODPUT,
    IntervalPlan,
    StepTime,
    TwoTierPlan,
    measured_step_time,
    plan_interval,
    plan_two_tier,
    waste_table,
)
from ckpt_tool.errors import CkptError, ExitCode


def _positive(option: str, value: float | None, allow_zero: bool = False) -> None:
    """Refuse a value the user typed, naming the option and the value as typed."""
    if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)):
        raise CkptError(
            f"{option} must be a {'non-negative' if allow_zero else 'positive'} number, got {value:g}",
            "see `ckpt plan --help`",
            ExitCode.USAGE,
        )


def _measured_step(target: Path, checkpoint_s: float) -> StepTime:
    """The step time the ranks measured in this run (checkpoint or run directory), and its source."""
    from ckpt_tool.cli.targets import locate
    from ckpt_tool.store.store import CheckpointStore
    from ckpt_tool.supervise.rank_vitals import read_rank_health

    run_dir, ckpt_dir = locate(target, "--run-dir", job_id_too=False)
    commits = []
    if ckpt_dir is not None and ckpt_dir.is_dir():
        commits = [dict(e.data) for e in CheckpointStore(ckpt_dir).events() if e.event == "commit"]
    found = measured_step_time(read_rank_health(run_dir) if run_dir.is_dir() else [], commits, checkpoint_s)
    if found is None:
        raise CkptError(
            f"{target} holds no measured step time: no rank step timings (rank_health.*.json) in {run_dir}, "
            f"and no two commits of one run in {ckpt_dir / 'index.jsonl' if ckpt_dir else 'its checkpoint index'} "
            "further apart than the checkpoint time (--ckpt-seconds)",
            "give --step-seconds, or point --run-dir at a run that trained longer under `ckpt run`",
            ExitCode.NOT_FOUND,
        )
    return found


def plan(
    ckpt_seconds: float = typer.Option(..., "--ckpt-seconds", help="Seconds one checkpoint costs the training (blocked time)."),
    mtbf_hours: float | None = typer.Option(None, "--mtbf-hours", help="Mean time between failures of the whole job."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs in the job (with --gpu-mtbf-hours)."),
    gpu_mtbf_hours: float | None = typer.Option(None, "--gpu-mtbf-hours", help="MTBF of one GPU (with its host share)."),
    restart_seconds: float = typer.Option(
        0.0, "--restart-seconds", help="Seconds from a failure to training again (detection, restart, load)."
    ),
    step_seconds: float | None = typer.Option(None, "--step-seconds", help="Seconds per training step (default: measured in --run-dir)."),
    run_dir: Path | None = run_dir_option(
        "A checkpoint directory or its run/ directory: the step time its ranks measured (their step timings, "
        "else the spacing of its commits) converts the interval into steps."
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
    as_json: bool = JsonTextOpt,
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
    measured: StepTime | None = None
    if run_dir is not None:
        measured = _measured_step(run_dir, local_seconds if local_seconds is not None else ckpt_seconds)
        step_seconds = measured.seconds
    step_source = {"step_seconds_source": measured.source if measured else ("--step-seconds" if step_seconds is not None else None)}
    if local_seconds is not None:
        local_restart = restart_seconds if local_restart_seconds is None else local_restart_seconds
        _print_two_tier(
            plan_two_tier(ckpt_seconds, local_seconds, mtbf_s, restart_seconds, local_restart, local_covers, step_seconds),
            as_json,
            measured,
            step_source,
        )
        return
    p = plan_interval(ckpt_seconds, mtbf_s, restart_seconds, step_seconds)
    if as_json:
        print_json(
            {
                "interval_seconds": round(p.interval_s, 3),
                "interval_steps": p.interval_steps,
                "step_seconds": step_seconds,
                **step_source,
                "expected_goodput": round(p.goodput, 6),
                "works": p.works,
                "young_seconds": round(p.young_s, 3),
                "mtbf_seconds": mtbf_s,
            }
        )
        return
    _print_measured(measured)
    if not p.works:
        out.print(_no_interval(p.goodput, f"a checkpoint of {ckpt_seconds:g} s", restart_seconds, mtbf_s))
    else:
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
                f"{tau / 60:.1f} min" + (" *" if tau == p.interval_s and p.works else ""),
                f"{g:.2%}",
                f"{waste:.2f}",
                "#" * max(1, round(30 * waste / worst)),
            )
            for tau, g, waste in rows
        ],
        title=f"MTBF {mtbf_s / 3600:.2f} h, checkpoint {ckpt_seconds:g} s, restart {restart_seconds:g} s",
    )


def _print_measured(measured: StepTime | None) -> None:
    if measured is not None:
        out.print(f"step time {measured.seconds:.3g} s, from the {measured.source}: {escape(measured.detail)}")


def _no_interval(best: float, cost: str, restart_s: float, mtbf_s: float) -> str:
    """The line that says no interval works (the best one keeps under ``MIN_GOODPUT`` for training)."""
    return (
        f"[bold red]no checkpoint interval works[/]: the best keeps {best:.2%} of the time for training (under {MIN_GOODPUT:.0%}) "
        f"with {cost} and a restart of {restart_s:g} s against an MTBF of {mtbf_s / 3600:.3g} h; "
        "make checkpoints cheaper (async saves, a fast tier: --local-seconds) or restarts faster, or the job's MTBF longer (fewer nodes)"
    )


def _every(p: IntervalPlan) -> str:
    steps = f" = {p.interval_steps} steps" if p.interval_steps else ""
    return f"{p.interval_s / 60:.1f} min{steps}"


def _print_two_tier(t: TwoTierPlan, as_json: bool, measured: StepTime | None, step_source: dict[str, str | None]) -> None:
    works = t.goodput >= MIN_GOODPUT
    if as_json:
        print_json(
            {
                "step_seconds": t.local.step_s,
                **step_source,
                "works": works,
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
    _print_measured(measured)
    gain = (t.goodput - t.shared_only.goodput) * DAY_S / 3600
    if not works:
        out.print(
            _no_interval(
                t.goodput,
                f"checkpoints of {t.local.checkpoint_s:g} s (fast tier) / {t.shared.checkpoint_s:g} s (shared)",
                t.shared.restart_s,
                t.shared_only.mtbf_s,
            )
        )
    else:
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
