"""``ckpt run / submit / recover / status / history``: parse, call the layers below, print.

One default for where a run's events go: ``CKPT_DIR/run`` (``ckpt run --ckpt-dir``, ``ckpt
submit --ckpt-dir``, and ``ckpt status CKPT_DIR`` all mean that directory); ``--run-dir``
overrides it everywhere.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from ckpt_tool.cli.options import JsonTextOpt, NodeCheckAtStartOpt, NodeCheckOpt, NodeCheckTimeoutOpt, json_option, run_dir_option
from ckpt_tool.cli.output import err, escape, human, out, print_error, print_json
from ckpt_tool.cli.targets import run_dir_for
from ckpt_tool.core.node_ledger import DEFAULT_SUSPECT_AFTER
from ckpt_tool.core.stragglers import StragglerPolicy
from ckpt_tool.core.timeouts import PHASES, TimeoutPolicy
from ckpt_tool.errors import CkptError, ExitCode


def _parse_timeouts(values: list[str]) -> dict[str, float]:
    out = {}
    for value in values:
        phase, sep, seconds = value.partition("=")
        try:
            number = float(seconds)
        except ValueError:
            number = -1.0
        if not sep or phase not in PHASES or number <= 0:
            raise CkptError(
                f"--timeout {value!r} is not PHASE=SECONDS with a positive number",
                f"phases: {', '.join(PHASES)}; e.g. --timeout step=30",
                ExitCode.USAGE,
            )
        out[phase] = number
    return out


def _human_event(record: dict[str, Any]) -> str:
    detail = ", ".join(f"{k}={human(v)}" for k, v in record.items() if k not in ("time", "event", "attempt", "argv"))
    return f"[ckpt run] {record['event']}: {detail}" if detail else f"[ckpt run] {record['event']}"


def run(
    command: list[str] = typer.Argument(
        ..., metavar="COMMAND", help="The training script and its arguments (after --), or -m MODULE ARGS.", show_default=False
    ),
    nproc_per_node: int = typer.Option(1, "--nproc-per-node", min=1, help="Ranks on this node."),
    nnodes: str = typer.Option("1", "--nnodes", help="Nodes, or MIN:MAX (torchrun syntax)."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the rendezvous (multi-node)."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="Rendezvous id (the SLURM job id under `ckpt submit`)."),
    max_restarts: int = typer.Option(3, "--max-restarts", min=0, help="Restarts in the same allocation after a crash or hang."),
    crash_loop: int = typer.Option(3, "--crash-loop", min=1, help="Stop after this many failures in a row without a new checkpoint."),
    suspect_after: int = typer.Option(
        DEFAULT_SUSPECT_AFTER,
        "--suspect-after",
        min=1,
        help="End the round (exit 77) when a node was blamed for this many failures in a row while the others were fine.",
    ),
    ckpt_dir: Path | None = typer.Option(
        None, "--ckpt-dir", help="The checkpoint directory: exported to the ranks as CKPT_DIR; events go to CKPT_DIR/run."
    ),
    run_dir: Path | None = run_dir_option("Event log and calibrated timeouts (default: CKPT_DIR/run)."),
    timeout: list[str] = typer.Option([], "--timeout", help="Override a phase timeout: PHASE=SECONDS (repeatable)."),
    grace: float = typer.Option(
        5.0,
        "--grace",
        min=0,
        help="Seconds between SIGTERM and SIGKILL when ckpt run ends torchrun (fatal error, crash loop, stop deadline). "
        "The ranks left after a rank failed or hung get 0.5 s.",
    ),
    stop_deadline: float = typer.Option(300.0, "--stop-deadline", min=1, help="Seconds to wait for the checkpoint after SIGUSR1/SIGTERM."),
    warm: bool = typer.Option(
        True, "--warm/--no-warm", help="Keep one pre-warmed spare process per rank (torch imported): restarts skip the imports."
    ),
    warm_import: list[str] = typer.Option(
        [],
        "--warm-import",
        help="A module the spares import too (your heavy imports; repeatable). Imported before the rank's environment is set.",
    ),
    straggler_threshold: float = typer.Option(
        0.75, "--straggler-threshold", help="A rank scoring below this (its peers' median time / its own, 0..1) is slow."
    ),
    straggler_steps: int = typer.Option(5, "--straggler-steps", min=1, help="Steps in a row a rank stays slow before it is reported."),
    straggler_seconds: float = typer.Option(
        5.0,
        "--straggler-seconds",
        help="Rolling medians span at least this many seconds of steps: a passing slowdown of the machine moves them by nothing (0: 5 steps).",
    ),
    straggler_suspect: bool = typer.Option(
        False,
        "--straggler-suspect",
        help="A reported straggler makes its node suspect: checkpoint, end the round (exit 77), the batch script leaves it behind.",
    ),
    gpu_monitor: bool = typer.Option(True, "--gpu-monitor/--no-gpu-monitor", help="Read the node's GPUs through NVML (the gpu extra)."),
    as_json: bool = json_option("Print each event as a JSON line on stdout."),
) -> None:
    """Run torchrun under a watchdog: crashes and hangs detected in seconds, restarts from the newest checkpoint.

    Exit codes: 0 finished; 1 failed (restarts exhausted); 2, 3 or 4 a rank stopped on an error a
    restart cannot fix (its message is in the events); 75 stopped after a checkpoint on
    SIGUSR1/SIGTERM (requeue me); 76 crash loop (no progress, not restarted again); 77 a node
    keeps failing (every node's `ckpt run` ends the round; the batch script leaves it behind); 78
    saves failed (the disk); 79 a wrong value the replay from the checkpoint reproduced (the data
    or the model: not restarted).
    """
    from rich.live import Live

    from ckpt_tool.slurm.submit import check_ckpt_dir_agrees, check_training_command
    from ckpt_tool.supervise.watchdog import RunConfig, Watchdog

    timeouts = TimeoutPolicy(overrides=_parse_timeouts(timeout))
    try:
        stragglers = StragglerPolicy(threshold=straggler_threshold, consecutive=straggler_steps, window_s=straggler_seconds)
    except ValueError as exc:
        raise CkptError(
            str(exc),
            "e.g. --straggler-threshold 0.75 (a rank 1.33x slower than its peers' median is slow) --straggler-seconds 5",
            ExitCode.USAGE,
        ) from exc
    _check_rendezvous(nnodes, rdzv_endpoint)
    _check_importable(warm_import)
    if ckpt_dir is not None:
        check_ckpt_dir_agrees(command, ckpt_dir)
    cfg = RunConfig(
        command=tuple(command),
        run_dir=run_dir_for(run_dir, ckpt_dir),
        ckpt_dir=ckpt_dir.absolute() if ckpt_dir is not None else None,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        crash_loop=crash_loop,
        suspect_after=suspect_after,
        grace_s=grace,
        stop_deadline_s=stop_deadline,
        timeouts=timeouts,
        warm=warm,
        warm_imports=tuple(warm_import),
        stragglers=stragglers,
        straggler_suspect=straggler_suspect,
        gpu_monitor=gpu_monitor,
    )
    check_training_command(command, Path.cwd())
    if as_json:
        code = Watchdog(cfg, report=lambda record: print(json.dumps(record, default=str), flush=True)).run()
    elif err.is_terminal:
        with Live(console=err, refresh_per_second=2, transient=True) as live:
            code = Watchdog(
                cfg, report=lambda record: live.console.print(escape(_human_event(record))), status=lambda s: live.update(_status_line(s))
            ).run()
    else:
        code = Watchdog(cfg, report=lambda record: print(_human_event(record), file=sys.stderr, flush=True)).run()
    raise typer.Exit(code)


def _check_rendezvous(nnodes: str, endpoint: str | None) -> None:
    """torchrun would take these as given and fail in its traceback, through every restart, and
    the run's history would record a failure: refuse them before anything starts."""
    from ckpt_tool.core.launch_values import parse_endpoint, parse_nnodes

    try:
        parse_nnodes(nnodes)
        if endpoint is not None:
            parse_endpoint(endpoint)
    except ValueError as exc:
        raise CkptError(str(exc), "see `ckpt run --help`; under ckpt submit the batch script sets both", ExitCode.USAGE) from None
    if endpoint is None and nnodes != "1":
        raise CkptError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (where the nodes meet: the first node's address and a free port)",
            "e.g. --nnodes 2 --rdzv-endpoint node1:29500 --rdzv-id myjob; one node alone: leave --nnodes out",
            ExitCode.USAGE,
        )


def _check_importable(modules: list[str]) -> None:
    """A ``--warm-import`` typo is a usage error now, not a spare maker that dies at every start."""
    from ckpt_tool.slurm.submit import missing_module

    for name in modules:
        missing = missing_module(name, Path.cwd(), run=False)  # imported, not run: a package is fine
        if missing is not None:
            raise CkptError(
                f"--warm-import {name}: no module {missing!r} for this Python ({sys.executable}), run from {os.getcwd()}",
                "give a module the training script itself imports (importable here), or leave --warm-import out",
                ExitCode.USAGE,
            )


def _status_line(status: dict[str, Any]) -> str:
    ranks = "  ".join(f"r{r}: step {step} {phase} {ago:.1f}s" for r, (step, phase, ago) in status["ranks"].items())
    slow = "  ".join(f"r{s.rank} {s.worst} {s.own / s.peers:.1f}x" for s in status.get("stragglers", ()) if s.peers)
    line = f"[bold]ckpt run[/] attempt {status['attempt']}  checkpoint {human(status['ckpt'])}  {escape(ranks) or 'starting...'}"
    return line + (f"  [yellow]straggler: {escape(slow)}[/]" if slow else "")


# --------------------------------------------------------------------------- submit and the requeue chain
def _parse_env(values: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep:
            raise CkptError(f"--env {value!r} is not NAME=VALUE", "e.g. --env NCCL_DEBUG=WARN", ExitCode.USAGE)
        pairs.append((key, val))
    return tuple(pairs)


_NOTIFY_HELP = (
    "Run this shell command (sh -c) once per event of the job, with the event's JSON on stdin (event, reason, job_id, "
    "ckpt_dir, nodes, message, next...): the job's end (finished, failed: crash_loop, save_failed...), a cancellation, "
    "nodes left behind or replaced, max requeues. E.g. 'curl -sS --data-binary @- https://hooks.example/T'. "
    "A failing or slow command never stops the job: it is recorded as notify_failed."
)
_NOTIFY_ON_HELP = "Only these events (comma list, repeatable; default: every one above; requeue may be added)."
_NOTIFY_TIMEOUT_HELP = "Seconds the --notify command may take; then it is killed (recorded as notify_failed)."


def submit(
    command: list[str] = typer.Argument(
        ..., metavar="COMMAND", help="The training script and its arguments (after --), or -m MODULE ARGS.", show_default=False
    ),
    ckpt_dir: Path = typer.Option(
        ..., "--ckpt-dir", help="Checkpoint directory on the shared filesystem; exported to the training as CKPT_DIR."
    ),
    nodes: int = typer.Option(1, "--nodes", min=1, help="Nodes to train on (the most the job uses for ranks)."),
    spares: int | None = typer.Option(
        None,
        "--spares",
        min=0,
        help="Hot spares: nodes allocated beside --nodes that stand by, each ready to take the slot of a node that keeps failing "
        "(same size, same world: an exact resume); default 0 or ckpt.toml's spares.",
    ),
    node_check: str | None = NodeCheckOpt,
    node_check_at_start: bool = NodeCheckAtStartOpt,
    node_check_timeout: int = NodeCheckTimeoutOpt,
    min_nodes: int | None = typer.Option(
        None,
        "--min-nodes",
        min=1,
        help="Fewest nodes the job may start or go on with (--nodes=MIN-MAX): a node that keeps failing is left behind while this many remain.",
    ),
    suspect_after: int = typer.Option(
        DEFAULT_SUSPECT_AFTER, "--suspect-after", min=1, help="Failures in a row blamed on one node (the others fine) that make it suspect."
    ),
    straggler_suspect: bool = typer.Option(
        False, "--straggler-suspect", help="A node whose rank stays a straggler is left behind too (ckpt run --straggler-suspect)."
    ),
    gpus_per_node: int = typer.Option(0, "--gpus-per-node", min=0, help="GPUs per node (also the ranks per node unless --nproc-per-node)."),
    nproc_per_node: int | None = typer.Option(None, "--nproc-per-node", min=1, help="Ranks per node (CPU runs)."),
    cpus_per_task: int | None = typer.Option(
        None, "--cpus-per-task", min=1, help="CPUs for each node's task, which runs all its ranks (default: one per rank)."
    ),
    mem: str | None = typer.Option(None, "--mem", help="Memory per node, SLURM syntax (e.g. 200G)."),
    time_limit: str | None = typer.Option(None, "--time", help="SLURM time limit, e.g. 24:00:00."),
    partition: str | None = typer.Option(None, "--partition"),
    account: str | None = typer.Option(None, "--account"),
    qos: str | None = typer.Option(None, "--qos"),
    constraint: str | None = typer.Option(None, "--constraint", help="Node features, SLURM syntax (e.g. 'a100&ib')."),
    job_name: str = typer.Option("ckpt-train", "--job-name"),
    signal_lead: int | None = typer.Option(
        None, "--signal-lead", min=30, help="Seconds before the limit to checkpoint (default: from the last measured checkpoint time)."
    ),
    max_requeues: int = typer.Option(10, "--max-requeues", min=0),
    max_restarts: int = typer.Option(3, "--max-restarts", min=0, help="Restarts inside one allocation (ckpt run)."),
    run_dir: Path | None = run_dir_option("Event log, scripts and job output (default: CKPT_DIR/run)."),
    sbatch_line: list[str] = typer.Option([], "--sbatch", help="Extra #SBATCH directive, e.g. --sbatch '--exclusive' (repeatable)."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE exported in the job (repeatable)."),
    notify: str | None = typer.Option(None, "--notify", metavar="CMD", help=_NOTIFY_HELP),
    notify_on: list[str] = typer.Option([], "--notify-on", metavar="EVENTS", help=_NOTIFY_ON_HELP),
    notify_timeout: float = typer.Option(30.0, "--notify-timeout", min=0.1, metavar="SECONDS", help=_NOTIFY_TIMEOUT_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the script; submit nothing."),
    as_json: bool = JsonTextOpt,
) -> None:
    """Submit a training job that survives time limits, preemptions and crashes by itself."""
    from ckpt_tool.core.render import follow_up_commands
    from ckpt_tool.slurm import submit as chain
    from ckpt_tool.slurm.commands import sbatch
    from ckpt_tool.supervise.run_dir import note

    spec, script = chain.prepare(
        command,
        ckpt_dir,
        run_dir,
        signal_lead,
        nodes=nodes,
        spares=spares,
        node_check=node_check,
        node_check_at_start=node_check_at_start,
        node_check_timeout_s=node_check_timeout,
        min_nodes=min_nodes,
        suspect_after=suspect_after,
        straggler_suspect=straggler_suspect,
        nproc_per_node=nproc_per_node or gpus_per_node or 1,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        mem=mem,
        time=time_limit,
        partition=partition,
        account=account,
        qos=qos,
        constraint=constraint,
        job_name=job_name,
        max_requeues=max_requeues,
        max_restarts=max_restarts,
        extra_sbatch=tuple(sbatch_line),
        env=_parse_env(env),
        check_command=not dry_run,
        notify=notify,
        notify_on=notify_on,
        notify_timeout_s=notify_timeout,
    )
    if dry_run:
        try:  # a dry run submits nothing: the script is shown, and what the job would not find said
            chain.check_job_command(spec)
        except CkptError as exc:
            err.print(f"[yellow]warning:[/] {escape(exc.message)}: the job would fail as it starts (ckpt submit refuses it)")
        text = chain.dry_run(spec, script)
        shown = {"dry_run": True, "script": text, "ckpt_dir": spec.ckpt_dir, "run_dir": spec.run_dir, "notify": notify}
        print_json(shown) if as_json else sys.stdout.write(text)
        return
    path = chain.write_script(spec, script)
    job_id = sbatch(str(path))
    note(Path(spec.run_dir), "submitted", job_id=job_id, script=str(path))
    if as_json:
        print_json(
            {"dry_run": False, "job_id": job_id, "script": str(path), "ckpt_dir": spec.ckpt_dir, "run_dir": spec.run_dir, "notify": notify}
        )
        return
    print(job_id)
    then = follow_up_commands(job_id, spec.ckpt_dir)
    err.print(f"submitted job [bold]{escape(job_id)}[/] ({escape(str(path))})")
    err.print(f"  follow:  {escape(then['status'])}\n           {escape(then['queue'])}\n  history: {escape(then['history'])}")
    if notify is not None:
        err.print(
            f"  notify:  {escape(notify)} (the job's events, as JSON on its stdin; failures: ckpt history {escape(spec.ckpt_dir)} --event notify_failed)"
        )


def recover(
    ckpt_dir: Path = typer.Argument(..., metavar="DIR", help="The checkpoint directory.", show_default=False),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Where the decision is written (recover.json, events.jsonl)."),
    world_size: int | None = typer.Option(None, "--world-size", min=1, help="Ranks of this allocation."),
    nodes: int | None = typer.Option(None, "--nodes", min=1, help="Nodes of this allocation (reported with the plan)."),
    full: bool = typer.Option(
        False,
        "--full",
        help="Also hash every file here (reads the whole checkpoint on this node; the ranks hash their files as they load anyway).",
    ),
    as_json: bool = JsonTextOpt,
) -> None:
    """Once per (re)start, before training: check the newest checkpoint's structure, roll back if damaged, check the world size."""
    from ckpt_tool.ops.recover import recover as do_recover

    decision = do_recover(ckpt_dir, world_size, run_dir, nodes, full)
    if as_json:
        print_json(decision.to_json())
        return
    for action in decision.cleanup:
        out.print(f"cleaned up: {escape(action)}")
    if decision.action == "fresh":
        out.print(f"fresh start: no checkpoint in {escape(str(ckpt_dir))} yet")
        return
    if decision.rolled_back_from is not None or decision.quarantined:
        out.print(
            f"[yellow]rolled back[/] from {human(decision.rolled_back_from)} to step {decision.step}; quarantined {human(list(decision.quarantined))}"
        )
    checked = f"{'hashes' if decision.hashes_checked else 'structure'} checked in {decision.seconds:.2f} s"
    if not decision.hashes_checked:
        checked += "; the ranks hash the files as they load"
    out.print(f"resume from step {decision.step} (saved by {decision.saved_world_size} ranks; {checked})")
    if decision.reshard is not None:
        old, new = decision.reshard["old"], decision.reshard["new"]  # type: ignore[index]
        if decision.nodes is not None:
            out.print(f"nodes {human(decision.nodes_before)} -> {decision.nodes}")
        meshes = decision.reshard.get("mesh") or {}  # type: ignore[union-attr]
        out.print(
            f"world size {decision.saved_world_size} -> {decision.world_size} (mesh {meshes.get('old')} -> {meshes.get('new')}): "
            f"micro-batch {new['micro_batch']} x accumulation {new['grad_accum']} "
            f"(was {old['micro_batch']} x {old['grad_accum']}), global batch {new['global_batch']} kept"
        )


def note_cmd(
    run_dir: Path = typer.Argument(..., show_default=False),
    event: str = typer.Argument(..., show_default=False),
    data: list[str] = typer.Argument(None, help="KEY=VALUE pairs."),
) -> None:
    """Append an event to RUN_DIR/events.jsonl (used by the sbatch script)."""
    from ckpt_tool.cli.main import note

    note(run_dir, event, data or [])


def free_port() -> None:
    """Print a TCP port that is free on this host now (the sbatch script's rendezvous port)."""
    from ckpt_tool.slurm.job import free_port as pick

    print(pick())


def job(
    command: list[str] = typer.Argument(
        ..., metavar="COMMAND", help="The training command (after --), as `ckpt submit` got it.", show_default=False
    ),
    ckpt_dir: Path = typer.Option(..., "--ckpt-dir", help="The checkpoint directory (the job's CKPT_DIR)."),
    run_dir: Path | None = run_dir_option("The run's events and the job's records (default: CKPT_DIR/run)."),
    max_requeues: int = typer.Option(10, "--max-requeues", min=0, help="Requeues at most (SLURM_RESTART_COUNT counts them)."),
    min_nodes: int = typer.Option(1, "--min-nodes", min=1, help="Fewest nodes to go on with; below it the job requeues."),
    suspect_after: int = typer.Option(DEFAULT_SUSPECT_AFTER, "--suspect-after", min=1, help="Failures in a row that make a node suspect."),
    nproc_per_node: int = typer.Option(1, "--nproc-per-node", min=1, help="Ranks per node."),
    max_restarts: int = typer.Option(3, "--max-restarts", min=0, help="Restarts inside one allocation (ckpt run)."),
    straggler_suspect: bool = typer.Option(False, "--straggler-suspect", help="ckpt run --straggler-suspect."),
    train_nodes: int | None = typer.Option(
        None, "--train-nodes", min=1, help="Nodes that run ranks (ckpt submit --nodes); the rest of the allocation stand by as hot spares."
    ),
    node_check: str | None = NodeCheckOpt,
    node_check_at_start: bool = NodeCheckAtStartOpt,
    node_check_timeout: int = NodeCheckTimeoutOpt,
    notify: str | None = typer.Option(None, "--notify", metavar="CMD", envvar="CKPT_NOTIFY", help=_NOTIFY_HELP),
    notify_on: list[str] = typer.Option([], "--notify-on", metavar="EVENTS", envvar="CKPT_NOTIFY_ON", help=_NOTIFY_ON_HELP),
    notify_timeout: float = typer.Option(
        30.0, "--notify-timeout", min=0.1, metavar="SECONDS", envvar="CKPT_NOTIFY_TIMEOUT", help=_NOTIFY_TIMEOUT_HELP
    ),
) -> None:
    """The batch job of `ckpt submit` (its script execs this): the whole requeue chain, once per start.

    ckpt nodes (give back a node left behind) -> rounds of \\[ckpt recover -> srun: one `ckpt run`
    per node]. Exit 0 of a round: finished. USR1 or TERM: ckpt run checkpoints; requeue, unless
    the TERM came from scancel (stop for good) or --max-requeues is reached. A failed round:
    ckpt nodes says shrink, requeue excluding the bad nodes, or stop. Every step is a line
    `\\[ckpt job=ID restart=N HH:MM:SS] ...` of the job's output and an event in RUN_DIR/events.jsonl.
    --notify CMD (the script exports it as CKPT_NOTIFY): CMD runs once per event of the job, not per
    node, with the event's JSON on stdin; a failure or a timeout is recorded as notify_failed.
    """
    from ckpt_tool.core.node_ledger import Roster
    from ckpt_tool.slurm.chain import RunSpec
    from ckpt_tool.slurm.job import Job, JobSteps, NodeCheck
    from ckpt_tool.slurm.submit import notify_config

    if not os.environ.get("SLURM_JOB_ID"):
        raise CkptError(
            "ckpt job runs inside a SLURM batch job (SLURM_JOB_ID is not set here)",
            "submit the training with `ckpt submit --ckpt-dir DIR -- train.py ...`; to train here, use `ckpt run`",
            ExitCode.USAGE,
        )
    runs_in = run_dir_for(run_dir, ckpt_dir)
    spec = RunSpec(
        ckpt=(sys.executable, "-m", "ckpt_tool.cli.main"),
        ckpt_dir=str(ckpt_dir.absolute()),
        run_dir=str(runs_in.absolute()),
        command=tuple(command),
        nproc_per_node=nproc_per_node,
        max_restarts=max_restarts,
        suspect_after=suspect_after,
        min_nodes=min_nodes,
        straggler_suspect=straggler_suspect,
    )
    if node_check_at_start and node_check is None:
        raise CkptError(
            "--node-check-at-start needs --node-check CMD", "e.g. --node-check 'dcgmi diag -r 1' --node-check-at-start", ExitCode.USAGE
        )
    told = notify_config(notify, notify_on, notify_timeout)
    roster = Roster(train_nodes, node_check=node_check is not None)
    steps = JobSteps(recover=_recover_step(ckpt_dir, runs_in), nodes=_nodes_step(ckpt_dir, runs_in, min_nodes, suspect_after, roster))
    check = NodeCheck(node_check, node_check_timeout) if node_check is not None else None
    raise typer.Exit(Job(spec, steps, max_requeues, node_check=check, node_check_at_start=node_check_at_start, notify=told).run())


def _recover_step(ckpt_dir: Path, run_dir: Path) -> Any:
    """``ckpt recover`` as the job calls it: printed as the command prints, its exit code returned."""

    def step(world_size: int, nodes: int) -> int:
        try:
            recover(ckpt_dir=ckpt_dir, run_dir=run_dir, world_size=world_size, nodes=nodes, full=False, as_json=False)
        except CkptError as exc:
            print_error(exc)
            return int(exc.exit_code)
        return 0

    return step


def _nodes_step(ckpt_dir: Path, run_dir: Path, min_nodes: int, suspect_after: int, roster: Any) -> Any:
    """``ckpt nodes --for-script`` as the job calls it: ACTION KEEP DROP EXCLUDE ACTIVE CHECK REPLACED."""

    def step(current: list[str], active: list[str], checked: list[str], after_failure: bool) -> tuple[str, ...]:
        from dataclasses import replace

        from ckpt_tool.ops.nodes import decide_nodes

        asked = replace(roster, active=tuple(active), checked=tuple(checked))
        plan = decide_nodes(ckpt_dir, run_dir, current, min_nodes, after_failure, suspect_after, asked)
        err.print(f"ckpt nodes: {plan.action}: {escape(plan.reason)}")
        return plan.script_fields()

    return step
