"""``ckpt plan``: a checkpoint interval from numbers (Young/Daly), not habit; or what hot spare nodes
buy a job against shrinking and requeueing (``--nodes``)."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from ckpt_tool.cli.options import JsonTextOpt, run_dir_option
from ckpt_tool.cli.output import Column, escape, out, plural, print_json, print_table
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
from ckpt_tool.core.spares_model import MAX_EXPECTED_FAILURES, SparesComparison, SparesScenario, compare_spares, expected_failures
from ckpt_tool.errors import CkptError, ExitCode

# The options of each mode (parameter names); --restart-seconds and --json belong to both.
INTERVAL_OPTIONS = (
    "ckpt_seconds",
    "mtbf_hours",
    "gpus",
    "gpu_mtbf_hours",
    "step_seconds",
    "run_dir",
    "local_seconds",
    "local_restart_seconds",
    "local_covers",
)
SPARES_OPTIONS = ("nodes", "spares", "node_mtbf_hours", "job_hours", "min_nodes", "requeue_wait_hours")
BOTH_WAYS = "give --ckpt-seconds with --mtbf-hours (interval), or --nodes with --node-mtbf-hours and --job-hours (spares)"
BOTH_EXAMPLES = "e.g. ckpt plan --ckpt-seconds 90 --gpus 512 --gpu-mtbf-hours 50000, or ckpt plan --nodes 64 --spares 2 --node-mtbf-hours 20000 --job-hours 336"
SPARES_RESTART_S = 300.0  # the spares mode's default --restart-seconds: detection, restart, load, lost work


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


def _whole(option: str, value: int, least: int) -> None:
    """Refuse a count below ``least``, naming the option and the value as typed."""
    if value < least:
        raise CkptError(f"{option} must be a whole number of at least {least}, got {value}", "see `ckpt plan --help`", ExitCode.USAGE)


def _typed(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` (parameter names) that the command line gave, as the user spells them."""
    spelled = {p.name: p.opts[0] for p in ctx.command.params}
    # by the source's name: typer 0.29 vendors click (typer._click), older ones use click itself
    return [spelled[n] for n in names if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"]


def plan(
    ctx: typer.Context,
    ckpt_seconds: float | None = typer.Option(
        None, "--ckpt-seconds", help="Seconds one checkpoint costs the training (blocked time); what an interval needs."
    ),
    mtbf_hours: float | None = typer.Option(None, "--mtbf-hours", help="Mean time between failures of the whole job."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs in the job (with --gpu-mtbf-hours)."),
    gpu_mtbf_hours: float | None = typer.Option(None, "--gpu-mtbf-hours", help="MTBF of one GPU (with its host share)."),
    restart_seconds: float | None = typer.Option(
        None,
        "--restart-seconds",
        help="Seconds from a failure to training again (detection, restart, load); default 0, with --nodes 300 (and there the work lost since the last checkpoint too).",
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
    nodes: int | None = typer.Option(
        None, "--nodes", help="Nodes the job trains on: plan what --spares standby nodes buy (with --node-mtbf-hours and --job-hours)."
    ),
    spares: int = typer.Option(1, "--spares", help="Idle standby nodes the job holds (with --nodes), compared with none."),
    node_mtbf_hours: float | None = typer.Option(
        None, "--node-mtbf-hours", help="MTBF of one node, hours (with --nodes); a node that fails is left behind."
    ),
    job_hours: float | None = typer.Option(None, "--job-hours", help="Hours of training the job needs at full size (with --nodes)."),
    min_nodes: int | None = typer.Option(
        None, "--min-nodes", help="Fewest nodes the job shrinks to before it requeues (with --nodes; default: --nodes, no shrink)."
    ),
    requeue_wait_hours: float = typer.Option(
        1.0, "--requeue-wait-hours", help="Hours a requeued job waits in the queue before it runs again on fresh nodes (with --nodes)."
    ),
    as_json: bool = JsonTextOpt,
) -> None:
    """Recommend a checkpoint interval (Young/Daly) and show goodput and waste per day around it;
    with --local-seconds, the intervals of a fast tier and the shared one and what the fast tier buys;
    with --nodes, what --spares standby nodes buy against shrinking (--min-nodes) and requeueing."""
    interval_given, spares_given = _typed(ctx, INTERVAL_OPTIONS), _typed(ctx, SPARES_OPTIONS)
    if interval_given and spares_given:
        raise CkptError(
            f"{', '.join(interval_given)} (a checkpoint interval) and {', '.join(spares_given)} (what spares buy) are two different plans",
            BOTH_WAYS,
            ExitCode.USAGE,
        )
    if spares_given:
        _plan_spares(
            nodes,
            spares,
            node_mtbf_hours,
            job_hours,
            min_nodes,
            requeue_wait_hours,
            SPARES_RESTART_S if restart_seconds is None else restart_seconds,
            as_json,
        )
        return
    if run_dir is not None and interval_given == ["--run-dir"] and restart_seconds is None:
        _compare_run(run_dir, as_json)
        return
    if ckpt_seconds is None and interval_given:
        alone = f"; or `ckpt plan --run-dir {run_dir}` alone: the run beside the model" if run_dir is not None else ""
        raise CkptError(
            f"missing option --ckpt-seconds (with {', '.join(interval_given)}): an interval needs the seconds one checkpoint costs",
            "e.g. ckpt plan --ckpt-seconds 90 --gpus 512 --gpu-mtbf-hours 50000" + alone,
            ExitCode.USAGE,
        )
    if ckpt_seconds is None:
        raise CkptError(BOTH_WAYS, BOTH_EXAMPLES, ExitCode.USAGE)
    restart_seconds = 0.0 if restart_seconds is None else restart_seconds
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


def _compare_run(target: Path, as_json: bool) -> None:
    """``ckpt plan --run-dir`` alone: the run's measured ETTR beside what the model predicts for its
    interval, checkpoint cost, MTBF and restart time, the cost that dominates and what would move it."""
    from ckpt_tool.cli.runs import read_timeline
    from ckpt_tool.cli.targets import locate
    from ckpt_tool.core.account import WORDS, account, duration
    from ckpt_tool.core.run_model import run_model

    run_dir, ckpt_dir = locate(target, "--run-dir", job_id_too=False)
    _, timeline, _ = read_timeline(run_dir, ckpt_dir)
    acct = account(timeline)
    if acct is None or acct.wall_s <= 0:
        raise CkptError(
            f"{target} holds no run to compare: no job started under `ckpt run` or `ckpt submit` ({run_dir / 'events.jsonl'})",
            "point --run-dir at the checkpoint directory of a run started with ckpt run or ckpt submit; "
            "or plan from numbers: ckpt plan --ckpt-seconds 90 --mtbf-hours 24",
            ExitCode.NOT_FOUND,
        )
    m = run_model(acct, timeline)
    if as_json:
        print_json({"account": acct.to_json(), "model": m.to_json()})
        return
    out.print(f"[bold]{escape(acct.summary())}[/] over {duration(acct.wall_s)}")
    out.print(f"measured ETTR {m.ettr:.1%}; without the job's start and end (which the model leaves out) {m.ettr_model_terms:.1%}")
    said = [
        f"a save blocks {m.checkpoint_s:.3g} s" if m.checkpoint_s is not None else "save cost not recorded (commits without blocked_s)",
        f"a checkpoint every {duration(m.interval_s)} of training" if m.interval_s is not None else "fewer than two checkpoints of one run",
        f"MTBF {duration(m.mtbf_s)} ({plural(m.interruptions, 'interruption')})" if m.mtbf_s is not None else "no failure yet",
        f"{duration(m.restart_s)} without training per interruption" if m.restart_s is not None else "",
    ]
    out.print("the run: " + escape(", ".join(x for x in said if x)))
    if m.predicted is not None and m.best_interval_s is not None and m.best_predicted is not None:
        out.print(
            f"the model (Daly) predicts {m.predicted:.1%} for these numbers (measured {m.ettr_model_terms:.1%}); "
            f"its interval for them: {duration(m.best_interval_s)}, predicted {m.best_predicted:.1%}"
        )
    else:
        out.print("the model needs a save cost, two checkpoints and a failure: not all measured in this run")
    if m.dominant is not None:
        out.print(f"the largest cost: [bold]{WORDS[m.dominant[0]]}[/] ({duration(m.dominant[1])})")
    for line in m.advice:
        out.print(f"  - {escape(line)}")


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


def _plan_spares(
    nodes: int | None,
    spares: int,
    node_mtbf_hours: float | None,
    job_hours: float | None,
    min_nodes: int | None,
    requeue_wait_hours: float,
    restart_seconds: float,
    as_json: bool,
) -> None:
    """``ckpt plan --nodes``: the job with its spares and without (core.spares_model), checked inputs first."""
    missing = [o for o, v in (("--nodes", nodes), ("--node-mtbf-hours", node_mtbf_hours), ("--job-hours", job_hours)) if v is None]
    if nodes is None or node_mtbf_hours is None or job_hours is None:
        raise CkptError(
            f"what spares buy needs --nodes, --node-mtbf-hours and --job-hours: {', '.join(missing)} missing",
            "e.g. ckpt plan --nodes 64 --spares 2 --node-mtbf-hours 20000 --job-hours 336",
            ExitCode.USAGE,
        )
    _whole("--nodes", nodes, 1)
    _whole("--spares", spares, 0)
    _positive("--node-mtbf-hours", node_mtbf_hours)
    _positive("--job-hours", job_hours)
    _positive("--requeue-wait-hours", requeue_wait_hours, allow_zero=True)
    _positive("--restart-seconds", restart_seconds, allow_zero=True)
    if min_nodes is not None and not 1 <= min_nodes <= nodes:
        raise CkptError(
            f"--min-nodes must be between 1 and --nodes ({nodes}), got {min_nodes}",
            "the fewest nodes the job trains on before it requeues; without it the job never shrinks",
            ExitCode.USAGE,
        )
    failures = expected_failures(nodes, node_mtbf_hours, job_hours)
    if failures > MAX_EXPECTED_FAILURES:
        raise CkptError(
            f"--nodes {nodes} x --job-hours {job_hours:g} / --node-mtbf-hours {node_mtbf_hours:g} is {failures:.3g} expected failures "
            f"per job, beyond what this plan models ({MAX_EXPECTED_FAILURES:g})",
            "--node-mtbf-hours is the MTBF of one node in hours (not the whole job's, not seconds)",
            ExitCode.USAGE,
        )
    c = compare_spares(nodes, spares, node_mtbf_hours, job_hours, min_nodes, requeue_wait_hours, restart_seconds)
    if as_json:
        print_json(
            {
                "nodes": nodes,
                "spares": spares,
                "min_nodes": c.with_spares.min_nodes,
                "node_mtbf_hours": node_mtbf_hours,
                "job_hours": job_hours,
                "requeue_wait_hours": requeue_wait_hours,
                "restart_seconds": restart_seconds,
                "expected_failures": round(failures, 6),
                "with_spares": _scenario_json(c.with_spares),
                "no_spares": _scenario_json(c.without),
                "wall_hours_saved": round(c.wall_hours_saved, 6),
                "node_hours_extra": round(c.node_hours_extra, 6),
                "better_by_wall": c.better_by_wall,
                "better_by_node_hours": c.better_by_node_hours,
            }
        )
        return
    s, n = c.with_spares, c.without
    out.print(_spares_headline(c))
    print_table(
        [
            Column("plan"),
            Column("wall h", "wall_hours", justify="right"),
            Column("goodput", justify="right"),
            Column("node-hour efficiency", "node_hour_efficiency", justify="right"),
            Column("mean nodes", "mean_nodes_active", justify="right"),
            Column("replacements", justify="right"),
            Column("shrinks", justify="right"),
            Column("requeues", justify="right"),
        ],
        [
            (
                label,
                f"{x.wall_hours:.2f}",
                f"{x.goodput:.2%}",
                f"{x.node_hour_efficiency:.2%}",
                f"{x.mean_nodes_active:.2f}",
                f"{x.replacements:.2f}",
                f"{x.shrinks:.2f}",
                f"{x.requeues:.2f}",
            )
            for label, x in ((_spares_label(s), s), (_none_label(n), n))
        ],
        title=f"{plural(nodes, 'node')}, node MTBF {node_mtbf_hours:g} h, {job_hours:g} h of training: {failures:.2f} expected failures; "
        f"restart {restart_seconds:g} s, requeue wait {requeue_wait_hours:g} h, "
        + (f"shrink down to {plural(s.min_nodes, 'node')}" if s.min_nodes < nodes else "no shrink (--min-nodes)"),
    )


def _scenario_json(x: SparesScenario) -> dict[str, float | int]:
    return {
        "spares": x.spares,
        "wall_hours": round(x.wall_hours, 6),
        "training_hours": round(x.training_hours, 6),
        "goodput": round(x.goodput, 6),
        "node_hour_efficiency": round(x.node_hour_efficiency, 6),
        "node_hours": round(x.node_hours, 6),
        "mean_nodes_active": round(x.mean_nodes_active, 6),
        "failures": round(x.failures, 6),
        "replacements": round(x.replacements, 6),
        "shrinks": round(x.shrinks, 6),
        "requeues": round(x.requeues, 6),
    }


def _spares_label(x: SparesScenario) -> str:
    return plural(x.spares, "spare")


def _none_label(x: SparesScenario) -> str:
    """The row without spares: it shrinks where --min-nodes lets it, else every failure requeues."""
    return "no spares (shrink)" if x.min_nodes < x.nodes else "no spares (requeue)"


def _hours(h: float) -> str:
    """A span of wall time that may be tiny: ``6.33 h``, ``12.0 min``, ``0.0029 s``."""
    return f"{h:.2f} h" if h >= 0.1 else (f"{h * 60:.1f} min" if h >= 1 / 60 else f"{h * 3600:.2g} s")


def _spares_headline(c: SparesComparison) -> str:
    """One sentence: the wall time the spares buy, the node-hours they cost, and which plan wins by each."""
    s, n = c.with_spares, c.without
    if s.spares == 0:
        return "0 spares is the plan without spares: nothing to compare (give --spares 1 or more)"
    verb = "s" if s.spares == 1 else ""  # 1 spare buys, 2 spares buy
    saved = c.wall_hours_saved
    buys = f"buy{verb} [bold]{_hours(saved)}[/] of wall time" if c.better_by_wall == "spares" else f"save{verb} no wall time"
    extra = c.node_hours_extra
    costs = f"cost{verb} [bold]{extra:.1%}[/] more node-hours" if extra >= 0 else f"save{verb} [bold]{-extra:.1%}[/] of the node-hours"
    word = {"spares": "better", "no spares": "worse", "tie": "even"}
    return (
        f"{_spares_label(s)} {buys} ({n.wall_hours:.2f} h without, {s.wall_hours:.2f} h with) and {costs} "
        f"({n.node_hours:.0f} node-h without, {s.node_hours:.0f} with): {word[c.better_by_wall]} by wall time, "
        f"{word[c.better_by_node_hours]} by node-hours than {_none_label(n)}"
    )
