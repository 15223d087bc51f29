"""``ckpt list / validate / verify / rollback / prune``: parse, call the layers below, print."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from ckpt_tool import config
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore

console = Console()

DirArg = typer.Argument(..., help="The checkpoint directory.", show_default=False)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def _default_step(store: CheckpointStore, step: int | None) -> int:
    if step is not None:
        return step
    latest = store.read_latest()
    if latest is None:
        raise CkptError(f"{store.root} has no LATEST checkpoint yet", "pass --step N, or see `ckpt list`", ExitCode.NOT_FOUND)
    return latest


# --------------------------------------------------------------------------- list
def list_checkpoints(
    directory: Path = DirArg,
    latest: bool = typer.Option(False, "--latest", help="Print only the newest committed step (reads LATEST: constant time)."),
    as_json: bool = JsonOpt,
) -> None:
    """Show the checkpoints in DIR: step, time, size, world size, global batch, status, probe loss."""
    store = CheckpointStore(directory)
    if latest:
        step = store.read_latest()
        if step is None:
            raise CkptError(f"{directory} has no committed checkpoint yet", "a training run writes LATEST at its first save", ExitCode.NOT_FOUND)
        _print_json({"step": step}) if as_json else print(step)
        return
    rows = store.rows()
    if as_json:
        _print_json([r.to_json() | {"path": str(store.root / r.path)} for r in rows])
        return
    table = Table(title=f"checkpoints in {directory}")
    for col, justify in (("step", "right"), ("status", "left"), ("latest", "center"), ("committed", "left"), ("size", "right"), ("world", "right"), ("global batch", "right"), ("probe loss", "right"), ("last validated", "left")):
        table.add_column(col, justify=justify)
    styles = {"verified": "green", "validated": "green", "invalid": "red", "quarantined": "red", "partial": "yellow"}
    for r in rows:
        style = styles.get(r.status, "")
        table.add_row(
            str(r.step),
            f"[{style}]{r.status}[/]" if style else r.status,
            "*" if r.latest else "",
            _when(r.committed_at),
            _size(r.bytes),
            str(r.world_size or "-"),
            str(r.global_batch or "-"),
            f"{r.probe_loss:.6g}" if r.probe_loss is not None else "-",
            _when(r.last_validated),
        )
    console.print(table)


# --------------------------------------------------------------------------- validate
def validate(
    directory: Path = DirArg,
    step: Optional[int] = typer.Option(None, "--step", min=0, help="Validate this step (default: the one LATEST names)."),
    all_steps: bool = typer.Option(False, "--all", help="Validate every committed checkpoint (scrubbing)."),
    threads: int = typer.Option(4, min=1, help="Files hashed in parallel."),
    as_json: bool = JsonOpt,
) -> None:
    """Check structure (files, sizes, DCP metadata, no extra files) and content hashes. Exit 0 only if all are valid."""
    from ckpt_tool.training.validate import validate_step  # noqa: PLC0415 - torch import only when needed

    store = CheckpointStore(directory)
    if all_steps and step is not None:
        raise CkptError("--step and --all exclude each other", "give one of them", ExitCode.USAGE)
    steps = store.committed_on_disk() if all_steps else [_default_step(store, step)]
    if not steps:
        raise CkptError(f"{directory} holds no committed checkpoint", "nothing to validate", ExitCode.NOT_FOUND)
    total = 0
    for s in steps:
        try:
            total += store.read_manifest(s).total_bytes
        except CkptError:
            pass
    results = []
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=Console(stderr=True), disable=as_json, transient=True) as progress:
        task = progress.add_task("hashing", total=total or None)
        for s in steps:
            progress.update(task, description=f"step {s}")
            result = validate_step(store, s, threads=threads, on_bytes=lambda n: progress.advance(task, n))
            store.record_check(s, "validated", result.ok, [str(p) for p in result.problems])
            results.append(result)
    if as_json:
        _print_json([{"step": r.step, "ok": r.ok, "problems": [p.__dict__ for p in r.problems]} for r in results])
    else:
        for r in results:
            if r.ok:
                console.print(f"[green]step {r.step}: valid[/] ({len(r.manifest.files) if r.manifest else 0} files, {_size(r.manifest.total_bytes if r.manifest else 0)})")
                continue
            table = Table(title=f"step {r.step}: {len(r.problems)} problem(s)", title_style="bold red")
            for col in ("file", "problem", "expected", "found"):
                table.add_column(col)
            for p in r.problems:
                table.add_row(p.file, p.what, p.expected, p.found)
            console.print(table)
        bad = [r.step for r in results if not r.ok]
        if bad:
            console.print(f"[yellow]hint:[/] run `ckpt rollback {directory} --auto` to move LATEST to the newest good checkpoint")
    if any(not r.ok for r in results):
        raise typer.Exit(ExitCode.FAILED)


# --------------------------------------------------------------------------- verify
def verify(
    directory: Path = DirArg,
    step: Optional[int] = typer.Option(None, "--step", min=0, help="Verify this step (default: the one LATEST names)."),
    entry: Optional[str] = typer.Option(None, "--entry", help="module:function returning (model, loss_fn); default: the manifest's, then [tool.ckpt] entry_point."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Ranks: >1 runs the check under torchrun (FSDP-sharded load)."),
    as_json: bool = JsonOpt,
) -> None:
    """Load the checkpoint into the model and recompute: step counter, probe loss, LR, gradient norm."""
    store = CheckpointStore(directory)
    step = _default_step(store, step)
    entry = entry or store.read_manifest(step).entry_point or config.default("entry_point")
    if nproc == 1:
        from ckpt_tool.training.verify import verify_step  # noqa: PLC0415

        report = verify_step(store, step, entry).to_json()
    else:
        report = _verify_under_torchrun(directory, step, entry, nproc)
    store.record_check(step, "verified", report["ok"], [f"{c['name']}: recorded {c['recorded']!r}, measured {c['measured']!r}" for c in report["checks"] if not c["ok"]])
    if as_json:
        _print_json(report)
    else:
        how = "bit-exact" if report["exact"] else "within tolerance (" + "; ".join(report["differences"]) + ")"
        table = Table(title=f"verify step {step}: {how}")
        for col in ("check", "recorded", "measured", "compared", "result"):
            table.add_column(col)
        for c in report["checks"]:
            table.add_row(c["name"], repr(c["recorded"]), repr(c["measured"]), c["how"], "[green]pass[/]" if c["ok"] else "[red]FAIL[/]")
        console.print(table)
    if not report["ok"]:
        raise typer.Exit(ExitCode.FAILED)


def _verify_under_torchrun(directory: Path, step: int, entry: str | None, nproc: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "ckpt_tool.training.verify_main", str(directory), str(step), str(out)]
        proc = subprocess.run(cmd + ([entry] if entry else []), capture_output=True, text=True)
        if not out.exists():
            raise CkptError(f"verify under torchrun failed (exit {proc.returncode}): {proc.stderr[-1500:]}", "run with --nproc 1 to see the error directly", ExitCode.FAILED)
        report = json.loads(out.read_text())
    if "error" in report:
        raise CkptError(report["error"], report["hint"], report["exit_code"])
    return report


# --------------------------------------------------------------------------- rollback
def rollback(
    directory: Path = DirArg,
    to: Optional[int] = typer.Option(None, "--to", min=0, help="Move LATEST to this step."),
    auto: bool = typer.Option(False, "--auto", help="Walk back from LATEST, validating and verifying each, until one passes."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; change nothing."),
    entry: Optional[str] = typer.Option(None, "--entry", help="Entry point for verification (default: the manifest's)."),
    reason: str = typer.Option("manual rollback", help="Recorded in the index with the event."),
    as_json: bool = JsonOpt,
) -> None:
    """Move LATEST back to a good checkpoint; newer ones are moved into quarantine/ (never deleted)."""
    from ckpt_tool.training.rollback import rollback as do_rollback  # noqa: PLC0415

    if to is not None and auto:
        raise CkptError("--to and --auto exclude each other", "give one of them", ExitCode.USAGE)
    report = do_rollback(CheckpointStore(directory), to, auto, dry_run, entry, reason)
    if as_json:
        _print_json(report.to_json())
        return
    if report.attempts:
        table = Table(title="checkpoints tried")
        for col in ("step", "valid", "verified", "problems"):
            table.add_column(col)
        for a in report.attempts:
            verified = "-" if a.verified is None else ("[green]yes[/]" if a.verified else "[red]no[/]")
            table.add_row(str(a.step), "[green]yes[/]" if a.valid else "[red]no[/]", verified, "; ".join(a.problems[:3]))
        console.print(table)
    verb = "would move" if dry_run else "moved"
    if report.target == report.previous_latest:
        console.print(f"LATEST already names step {report.target}, which passed: nothing to do")
    else:
        console.print(f"{verb} LATEST from {report.previous_latest} to step {report.target}")
    if report.quarantined:
        console.print(f"{'would quarantine' if dry_run else 'quarantined'} steps {list(report.quarantined)} into {directory / 'quarantine'}")


# --------------------------------------------------------------------------- prune
def prune(
    directory: Path = DirArg,
    keep_last: int = typer.Option(..., min=1, help="Keep the newest K committed checkpoints (required: deleting has no default)."),
    keep_every: Optional[int] = typer.Option(None, min=1, help="Also keep every step divisible by M."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be deleted; delete nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Apply the retention policy by hand (never LATEST, never quarantined checkpoints)."""
    store = CheckpointStore(directory)
    victims = store.apply_retention(RetentionPolicy(keep_last, keep_every), dry_run=dry_run)
    if as_json:
        _print_json({"deleted": [] if dry_run else victims, "would_delete": victims if dry_run else []})
    elif not victims:
        console.print("nothing to delete")
    else:
        console.print(f"{'would delete' if dry_run else 'deleted'} steps {victims}")


# --------------------------------------------------------------------------- reshard
def reshard(
    directory: Path = DirArg,
    world_size: int = typer.Option(..., "--world-size", min=1, help="The new number of data-parallel ranks."),
    step: Optional[int] = typer.Option(None, "--step", min=0, help="Default: the step LATEST names."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=1, help="Preferred micro-batch (must divide the per-rank batch)."),
    in_place: bool = typer.Option(False, "--in-place", help="Record the plan in the checkpoint's manifest lineage (used at resume)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write a copy laid out for the new world size (each rank then reads only its slice)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; write nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Check that a checkpoint loads at a new world size and plan the batch split that keeps the global batch."""
    from ckpt_tool.training.reshard import plan_reshard, record_plan  # noqa: PLC0415

    if in_place and out is not None:
        raise CkptError("--in-place and --out exclude each other", "give one of them", ExitCode.USAGE)
    store = CheckpointStore(directory)
    report = plan_reshard(store, _default_step(store, step), world_size, micro_batch)
    if in_place and not dry_run:
        record_plan(store, report)
    if out is not None and not dry_run:
        _materialize(directory, report.step, out, world_size, micro_batch)
    if as_json:
        _print_json(report.to_json() | {"recorded": in_place and not dry_run})
        return
    plan = report.plan.to_json()
    table = Table(title=f"reshard step {report.step}: {report.old_world_size} -> {report.new_world_size} ranks")
    for col in ("", "world size", "micro-batch", "grad accumulation", "global batch"):
        table.add_column(col, justify="right")
    for name, b, w in (("old", plan["old"], report.old_world_size), ("new", plan["new"], report.new_world_size)):
        table.add_row(name, str(w), str(b["micro_batch"]), str(b["grad_accum"]), str(b["global_batch"]))
    console.print(table)
    console.print(f"data position (global, unchanged): {report.data_position}")
    if out is not None and not dry_run:
        console.print(f"wrote step {report.step} laid out for {world_size} ranks to {out}; resume there with --world-size {world_size}")
        return
    console.print(
        "recorded in the manifest's lineage: resume the job at the new size" if in_place and not dry_run
        else "nothing written; resuming at the new size applies this plan automatically (--in-place records it)"
    )


def _materialize(directory: Path, step: int, out: Path, world_size: int, micro_batch: int | None) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}", "-m", "ckpt_tool.training.reshard_main", str(directory), str(step), str(out)]
    proc = subprocess.run(cmd + ([str(micro_batch)] if micro_batch else []), capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "error:" in line or "hint:" in line]
        raise CkptError(f"writing the resharded copy failed (exit {proc.returncode}): " + (" ".join(errors[:2]) or proc.stderr[-1500:]), f"nothing was committed in {out}; run with --dry-run to check the plan", ExitCode.FAILED)
