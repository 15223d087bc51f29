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


# --------------------------------------------------------------------------- submit and the requeue chain
def _parse_env(values: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep:
            raise CkptError(f"--env {value!r} is not NAME=VALUE", "e.g. --env NCCL_DEBUG=WARN", ExitCode.USAGE)
        out.append((key, val))
    return tuple(out)


def submit(
    command: List[str] = typer.Argument(..., help="The training script and its arguments (after --), or -m MODULE ARGS.", show_default=False),
    ckpt_dir: Path = typer.Option(..., "--ckpt-dir", help="Checkpoint directory on the shared filesystem (the training script must use it too)."),
    nodes: int = typer.Option(1, "--nodes", min=1),
    gpus_per_node: int = typer.Option(0, "--gpus-per-node", min=0, help="GPUs per node (also the ranks per node unless --nproc-per-node)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", min=1, help="Ranks per node (CPU runs)."),
    time_limit: Optional[str] = typer.Option(None, "--time", help="SLURM time limit, e.g. 24:00:00."),
    partition: Optional[str] = typer.Option(None, "--partition"),
    account: Optional[str] = typer.Option(None, "--account"),
    qos: Optional[str] = typer.Option(None, "--qos"),
    constraint: Optional[str] = typer.Option(None, "--constraint"),
    job_name: str = typer.Option("ckpt-train", "--job-name"),
    signal_lead: Optional[int] = typer.Option(None, "--signal-lead", min=30, help="Seconds before the limit to checkpoint (default: from the last measured checkpoint time)."),
    max_requeues: int = typer.Option(10, "--max-requeues", min=0),
    max_restarts: int = typer.Option(3, "--max-restarts", min=0, help="Restarts inside one allocation (ckpt run)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Event log, scripts and job output (default: CKPT_DIR/run)."),
    sbatch_line: List[str] = typer.Option([], "--sbatch", help="Extra #SBATCH directive, e.g. --sbatch '--exclusive' (repeatable)."),
    env: List[str] = typer.Option([], "--env", help="NAME=VALUE exported in the job (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the script; submit nothing."),
) -> None:
    """Submit a training job that survives time limits, preemptions and crashes by itself."""
    from ckpt_tool.slurm import submit as chain  # noqa: PLC0415
    from ckpt_tool.slurm.commands import sbatch  # noqa: PLC0415
    from ckpt_tool.supervise.events import note  # noqa: PLC0415

    spec, script = chain.prepare(
        command,
        ckpt_dir,
        run_dir,
        signal_lead,
        nodes=nodes,
        nproc_per_node=nproc_per_node or gpus_per_node or 1,
        gpus_per_node=gpus_per_node,
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
    )
    if dry_run:
        sys.stdout.write(chain.dry_run(spec, script))
        return
    path = chain.write_script(spec, script)
    job_id = sbatch(str(path))
    note(Path(spec.run_dir), "submitted", job_id=job_id, script=str(path))
    print(job_id)
    console.print(f"submitted job [bold]{job_id}[/] ({path})\n  follow: ckpt status {spec.ckpt_dir}   squeue -j {job_id}\n  history: ckpt history {spec.ckpt_dir}")


def recover(
    ckpt_dir: Path = typer.Argument(..., help="The checkpoint directory.", show_default=False),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where the decision is written (recover.json, events.jsonl)."),
    world_size: Optional[int] = typer.Option(None, "--world-size", min=1, help="Ranks of this allocation."),
) -> None:
    """Once per (re)start, before training: validate the newest checkpoint, roll back if damaged, check the world size."""
    import json  # noqa: PLC0415

    from ckpt_tool.training.recover import recover as do_recover  # noqa: PLC0415

    decision = do_recover(ckpt_dir, world_size, run_dir)
    print(json.dumps(decision.to_json()))


def note_cmd(
    run_dir: Path = typer.Argument(..., show_default=False),
    event: str = typer.Argument(..., show_default=False),
    data: List[str] = typer.Argument(None, help="KEY=VALUE pairs."),
) -> None:
    """Append an event to RUN_DIR/events.jsonl (used by the sbatch script)."""
    from ckpt_tool.supervise.events import note  # noqa: PLC0415

    fields = dict(item.partition("=")[::2] for item in data or [])
    note(run_dir, event, **fields)


def _locate(target: Path) -> tuple[Path, Path | None]:
    """A run directory (holding events.jsonl) and its checkpoint directory, from either."""
    if (target / "events.jsonl").exists() or target.name == "run":
        return target, target.parent if (target.parent / "LATEST").exists() or target.name == "run" else None
    return target / "run", target


def status(
    target: str = typer.Argument(..., help="A job id, a checkpoint directory or a run directory.", show_default=False),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Job state, restarts and requeues so far, newest checkpoint and its age, last events."""
    import json  # noqa: PLC0415
    import time as _time  # noqa: PLC0415

    from ckpt_tool.slurm.commands import job_state  # noqa: PLC0415
    from ckpt_tool.store.store import CheckpointStore  # noqa: PLC0415
    from ckpt_tool.supervise.events import read_events  # noqa: PLC0415

    out: dict[str, Any] = {}
    events: list[dict[str, Any]] = []
    job_id = target if target.isdigit() else None
    if job_id is None:
        run_dir, ckpt_dir = _locate(Path(target))
        if not run_dir.exists() and (ckpt_dir is None or not ckpt_dir.exists()):
            raise CkptError(f"{target} is neither a job id nor a checkpoint or run directory", "pass the --ckpt-dir of `ckpt submit`, or a job id", ExitCode.NOT_FOUND)
        events = read_events(run_dir)
        ids = [e.get("job_id") for e in events if e.get("job_id")]
        job_id = str(ids[-1]) if ids else None
        out["run_dir"] = str(run_dir)
        if ckpt_dir is not None and ckpt_dir.exists():
            store = CheckpointStore(ckpt_dir)
            latest = store.latest_or_none()
            out["newest_checkpoint"] = latest
            if latest is not None:
                age = _time.time() - store.read_manifest(latest).created_at
                out["checkpoint_age_s"] = round(age, 1)
    state = job_state(job_id) if job_id else None
    out["job_id"] = job_id
    out["job_state"] = state.state if state else None
    out["slurm_restarts"] = state.restarts if state else None
    job_events = [e for e in events if str(e.get("job_id", job_id)) == str(job_id)] if job_id else events
    out["starts"] = sum(1 for e in job_events if e["event"] == "job_start")
    out["requeues"] = sum(1 for e in events if e["event"] == "requeue")
    out["in_allocation_restarts"] = sum(1 for e in events if e["event"] == "restarted")
    finals = [e["event"] for e in events if e["event"] in ("job_finished", "job_failed", "max_requeues_reached", "requeue_failed", "crash_loop")]
    out["final"] = finals[-1] if finals else None
    out["last_events"] = events[-8:]
    if as_json:
        sys.stdout.write(json.dumps(out, indent=1, default=str) + "\n")
        return
    console.print(f"job [bold]{job_id or '-'}[/]: {out['job_state'] or 'unknown'}  starts {out['starts']}  requeues {out['requeues']}  restarts in allocation {out['in_allocation_restarts']}")
    if "newest_checkpoint" in out:
        console.print(f"newest checkpoint: step {out['newest_checkpoint']} ({out.get('checkpoint_age_s', '-')} s old)")
    if out["final"]:
        console.print(f"final state: [bold]{out['final']}[/]")
    for e in out["last_events"]:
        console.print(f"  {_time.strftime('%H:%M:%S', _time.localtime(e['time']))} {e['event']} " + " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event", "argv")))


def history(
    target: Path = typer.Argument(..., help="A checkpoint directory or a run directory.", show_default=False),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The run's timeline: saves, failures, restarts, requeues and rollbacks."""
    import json  # noqa: PLC0415
    import time as _time  # noqa: PLC0415

    from rich.table import Table  # noqa: PLC0415

    from ckpt_tool.store.store import CheckpointStore  # noqa: PLC0415
    from ckpt_tool.supervise.events import read_events  # noqa: PLC0415

    run_dir, ckpt_dir = _locate(target)
    timeline = [{"source": "run", **e} for e in read_events(run_dir)]
    if ckpt_dir is not None and ckpt_dir.exists():
        timeline += [{"source": "checkpoints", "time": e.time, "event": e.event, **e.data} for e in CheckpointStore(ckpt_dir).events()]
    if not timeline:
        raise CkptError(f"no events found for {target}", "pass the --ckpt-dir of `ckpt submit` (or its run/ directory)", ExitCode.NOT_FOUND)
    timeline.sort(key=lambda e: e["time"])
    if as_json:
        sys.stdout.write(json.dumps(timeline, indent=1, default=str) + "\n")
        return
    table = Table(title=f"history of {target}")
    for col in ("time", "source", "event", "details"):
        table.add_column(col)
    styles = {"hang": "red", "rank_exited": "red", "quarantine": "red", "crash_loop": "red", "job_failed": "red", "requeue": "yellow", "restarted": "yellow", "rollback": "yellow", "commit": "green"}
    for e in timeline:
        details = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event", "source", "argv", "run_id"))
        style = styles.get(e["event"], "")
        table.add_row(_time.strftime("%m-%d %H:%M:%S", _time.localtime(e["time"])), e["source"], f"[{style}]{e['event']}[/]" if style else e["event"], details[:120])
    console.print(table)


def free_port() -> None:
    """Print a TCP port that is free on this host now (the sbatch script's rendezvous port)."""
    import socket  # noqa: PLC0415

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        print(s.getsockname()[1])
