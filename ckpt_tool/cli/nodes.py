"""``ckpt nodes``: which nodes the job goes on with (asked by the sbatch script). Parse, call, print."""

from __future__ import annotations

from pathlib import Path

import typer

from ckpt_tool.cli.options import DirArg, JsonTextOpt, run_dir_option
from ckpt_tool.cli.output import err, escape, human, out, print_json
from ckpt_tool.cli.targets import run_dir_for
from ckpt_tool.core.node_ledger import DEFAULT_SUSPECT_AFTER


def nodes(
    ckpt_dir: Path = DirArg,
    current: str = typer.Option(..., "--nodes", help="The job's nodes now, comma-separated (scontrol show hostnames)."),
    min_nodes: int = typer.Option(1, "--min-nodes", min=1, help="Fewest nodes to go on with; below it the job requeues."),
    after_failure: bool = typer.Option(False, "--after-failure", help="A round just failed: drop suspects, or stop when none is."),
    suspect_after: int = typer.Option(DEFAULT_SUSPECT_AFTER, "--suspect-after", min=1, help="Failures in a row that make a node suspect."),
    run_dir: Path | None = run_dir_option("The run's events (default: CKPT_DIR/run)."),
    for_script: bool = typer.Option(False, "--for-script", help="One line: ACTION KEEP DROP EXCLUDE (comma lists, - for none)."),
    as_json: bool = JsonTextOpt,
) -> None:
    """Decide which nodes to go on with: continue, shrink (leave suspects behind), requeue excluding them, or stop.

    The sbatch script of `ckpt submit` asks at every start and after every failed round, and
    carries the answer out with scontrol. A node is suspect after --suspect-after failures in a
    row blamed on it while the other nodes were fine (see `ckpt status` for the ledger).
    """
    from ckpt_tool.ops.nodes import decide_nodes

    names = [n.strip() for n in current.replace(" ", ",").split(",") if n.strip()] or [current]
    plan = decide_nodes(ckpt_dir, run_dir_for(run_dir, ckpt_dir), names, min_nodes, after_failure, suspect_after)
    if for_script:
        print(" ".join([plan.action, *(",".join(x) or "-" for x in (plan.keep, plan.drop, plan.exclude))]))
        err.print(f"ckpt nodes: {plan.action}: {escape(plan.reason)}")
    elif as_json:
        print_json(plan.to_json())
    else:
        out.print(f"{plan.action}: {escape(plan.reason)}")
        out.print(f"  keep {escape(human(plan.keep))}; drop {escape(human(plan.drop))}; exclude {escape(human(plan.exclude))}")
