"""``ckpt nodes``: which nodes the job goes on with (asked by the sbatch script). Parse, call, print."""

from __future__ import annotations

from pathlib import Path

import typer

from ckpt_tool.cli.options import DirArg, JsonTextOpt, run_dir_option
from ckpt_tool.cli.output import err, escape, human, out, print_json
from ckpt_tool.cli.targets import run_dir_for
from ckpt_tool.core.node_ledger import DEFAULT_SUSPECT_AFTER, Roster


def node_names(text: str) -> list[str]:
    """A node list as typed or as the chain writes it: comma- or space-separated, ``-`` for none."""
    return [n.strip() for n in text.replace(" ", ",").split(",") if n.strip() and n.strip() != "-"]


def nodes(
    ckpt_dir: Path = DirArg,
    current: str = typer.Option(..., "--nodes", help="The job's nodes now, comma-separated (scontrol show hostnames)."),
    min_nodes: int = typer.Option(1, "--min-nodes", min=1, help="Fewest nodes to go on with; below it the job requeues."),
    after_failure: bool = typer.Option(False, "--after-failure", help="A round just failed: drop suspects, or stop when none is."),
    suspect_after: int = typer.Option(DEFAULT_SUSPECT_AFTER, "--suspect-after", min=1, help="Failures in a row that make a node suspect."),
    run_dir: Path | None = run_dir_option("The run's events (default: CKPT_DIR/run)."),
    train_nodes: int | None = typer.Option(
        None, "--train-nodes", min=1, help="Nodes that run ranks (ckpt submit --nodes); the rest of --nodes stand by as hot spares."
    ),
    active: str = typer.Option("-", "--active", help="The nodes that ran the last round (default: the first --train-nodes of --nodes)."),
    node_check: bool = typer.Option(False, "--node-check", help="A standby must pass its pre-flight check before it takes a slot."),
    checked: str = typer.Option("-", "--checked", help="Standbys whose pre-flight check passed for this decision."),
    for_script: bool = typer.Option(
        False,
        "--for-script",
        help="One line: ACTION KEEP DROP EXCLUDE (comma lists, - for none); with --train-nodes also ACTIVE CHECK REPLACED.",
    ),
    as_json: bool = JsonTextOpt,
) -> None:
    """Decide which nodes to go on with: continue, replace (a standby takes a suspect's slot), shrink
    (leave suspects behind), requeue excluding them, check (pre-flight the standbys first), or stop.

    The sbatch script of `ckpt submit` asks at every start and after every failed round, and
    carries the answer out with scontrol. A node is suspect after --suspect-after failures in a
    row blamed on it while the other nodes were fine (see `ckpt status` for the ledger).
    """
    from ckpt_tool.ops.nodes import decide_nodes

    roster = Roster(train_nodes, tuple(node_names(active)), node_check, tuple(node_names(checked)))
    plan = decide_nodes(
        ckpt_dir, run_dir_for(run_dir, ckpt_dir), node_names(current) or [current], min_nodes, after_failure, suspect_after, roster
    )
    if for_script:
        fields = plan.script_fields()
        print(" ".join(fields if train_nodes is not None else fields[:4]))  # scripts queued before spares read four
        err.print(f"ckpt nodes: {plan.action}: {escape(plan.reason)}")
    elif as_json:
        print_json(plan.to_json())
    else:
        out.print(f"{plan.action}: {escape(plan.reason)}")
        out.print(f"  keep {escape(human(plan.keep))}; drop {escape(human(plan.drop))}; exclude {escape(human(plan.exclude))}")
        if train_nodes is not None:
            out.print(f"  active {escape(human(plan.active))}; standby {escape(human(plan.standby))}")
