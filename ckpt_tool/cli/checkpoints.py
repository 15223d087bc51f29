"""``ckpt list / validate / verify / rollback / prune / reshard``: parse, call the layers below, print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer

from ckpt_tool import config
from ckpt_tool.cli.output import Column, err, escape, human, out, print_json, print_table, size, when, when_short
from ckpt_tool.core import layout
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore, ValidationResult

DirArg = typer.Argument(..., help="The checkpoint directory.", show_default=False)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")
STATUS_STYLES = {
    "verified": "green",
    "validated": "green",
    "invalid": "red",
    "damaged": "red",
    "missing": "red",
    "quarantined": "red",
    "partial": "yellow",
    "deleting": "yellow",
}


def open_checkpoints(directory: Path) -> CheckpointStore:
    """An existing ckpt-tool checkpoint directory, or a clear error saying what was found."""
    store = CheckpointStore(directory)
    store.require_checkpoint_directory()
    return store


def resolve_step(store: CheckpointStore, step: int | None) -> int:
    """``--step N`` (exit 3 when no such step directory exists), else the step LATEST names."""
    if step is not None:
        if not store.step_path(step).is_dir():
            raise store.no_such_step(step)
        return step
    latest = store.read_latest()
    if latest is None:
        raise CkptError(f"{store.root} has no LATEST checkpoint yet", "pass --step N, or see `ckpt list`", ExitCode.NOT_FOUND)
    if not store.step_path(latest).is_dir():
        raise CkptError(
            f"LATEST in {store.root} names step {latest}, whose directory is missing",
            f"run `ckpt rollback {store.root} --auto` to point it at the newest valid checkpoint",
            ExitCode.FAILED,
        )
    return latest


def note(text: str | None) -> None:
    if text:
        err.print(f"[yellow]note:[/] {escape(text)}")


# --------------------------------------------------------------------------- list
def list_checkpoints(
    directory: Path = DirArg,
    latest: bool = typer.Option(False, "--latest", help="Print only the newest committed step (reads LATEST: constant time)."),
    as_json: bool = JsonOpt,
) -> None:
    """Show every checkpoint in DIR: step, status, time, size, world size, global batch, probe loss."""
    store = open_checkpoints(directory)
    if latest:
        step = store.read_latest()
        if step is None:
            raise CkptError(
                f"{directory} has no committed checkpoint yet", "a training run writes LATEST at its first save", ExitCode.NOT_FOUND
            )
        if not (store.step_path(step) / layout.MANIFEST_NAME).is_file():
            raise CkptError(
                f"LATEST in {directory} names step {step}, which is not a committed checkpoint (missing or damaged)",
                f"run `ckpt rollback {directory} --auto`",
                ExitCode.FAILED,
            )
        print_json({"step": step}) if as_json else print(step)
        return
    listing = store.listing()
    if not listing.rows:
        raise CkptError(
            f"{directory} holds no checkpoint yet",
            "a training run writes its first one at its first save; see `ckpt history` for what happened",
            ExitCode.NOT_FOUND,
        )
    if as_json:
        print_json(listing.to_json(str(store.root)))
        return
    columns = [
        Column("step", justify="right", no_wrap=True),
        Column("status", styles=STATUS_STYLES, no_wrap=True),
        Column("", "latest", justify="center", terminal=lambda v: "*" if v else "", full=lambda v: "yes" if v else "no"),
        Column("saved", "saved_at", terminal=when_short, full=when),
        Column("size", "bytes", justify="right", terminal=size, no_wrap=True),
        Column("world", "world_size", justify="right"),
        Column("batch", "global_batch", justify="right"),
        Column("probe loss", justify="right", terminal=lambda v: "-" if v is None else f"{v:.6g}", no_wrap=True),
        Column("validated", "last_validated", terminal=when_short, full=when),
        Column("path", on_terminal=False),
    ]
    rows = [
        (r.step, r.status, r.latest, r.committed_at, r.bytes, r.world_size, r.global_batch, r.probe_loss, r.last_validated, r.path)
        for r in listing.rows
    ]
    print_table(columns, rows, title=f"checkpoints in {directory}")
    if listing.latest_problem:
        err.print(f"[bold red]LATEST:[/] {escape(listing.latest_problem)}")
        err.print(f"[yellow]hint:[/] {escape(f'run `ckpt rollback {directory} --auto` to point it at the newest valid checkpoint')}")
    for text in listing.notes:
        note(text)


# --------------------------------------------------------------------------- validate
def _problems_json(r: ValidationResult) -> dict[str, Any]:
    return {"step": r.step, "ok": r.ok, "problems": [p.__dict__ for p in r.problems], "unreadable": list(r.unreadable)}


def validate(
    directory: Path = DirArg,
    step: int | None = typer.Option(None, "--step", min=0, max=layout.MAX_STEP, help="Validate this step (default: the one LATEST names)."),
    all_steps: bool = typer.Option(False, "--all", help="Validate every committed checkpoint (scrubbing)."),
    threads: int = typer.Option(4, min=1, help="Files hashed in parallel."),
    as_json: bool = JsonOpt,
) -> None:
    """Check structure (files, sizes, DCP metadata, no extra files) and content hashes. Exit 0 only if all are valid.

    Works on a directory you may only read; the result is recorded in its index when possible.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from ckpt_tool.training.validation import validate_checkpoint

    if all_steps and step is not None:
        raise CkptError("--step and --all exclude each other", "give one of them", ExitCode.USAGE)
    store = open_checkpoints(directory)
    steps = store.committed_on_disk() if all_steps else [resolve_step(store, step)]
    if not steps:
        raise CkptError(f"{directory} holds no committed checkpoint", "nothing to validate", ExitCode.NOT_FOUND)
    total = 0
    for s in steps:
        try:
            total += store.read_manifest(s).total_bytes
        except CkptError:
            pass
    results: list[ValidationResult] = []
    notes: list[str] = []
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        disable=as_json,
        transient=True,
    ) as progress:
        task = progress.add_task("hashing", total=total or None)
        for s in steps:
            progress.update(task, description=f"step {s}")
            result = validate_checkpoint(store, s, threads=threads, on_bytes=lambda n: progress.advance(task, n))
            if not (result.unreadable and not result.problems):  # a check that could not run records nothing
                notes.append(store.record_check(s, "validated", result.ok, [str(p) for p in result.problems]) or "")
            results.append(result)
    notes = sorted({n for n in notes if n})
    damaged = [r.step for r in results if r.problems]
    unreadable = [r for r in results if r.unreadable and not r.problems]
    if as_json:
        print_json(
            {"directory": str(store.root), "ok": all(r.ok for r in results), "steps": [_problems_json(r) for r in results], "notes": notes}
        )
    else:
        for r in results:
            if r.ok:
                files = len(r.manifest.files) if r.manifest else 0
                out.print(f"[green]step {r.step}: valid[/] ({files} files, {size(r.manifest.total_bytes if r.manifest else 0)})")
            elif r.problems:
                out.print(f"[bold red]step {r.step}: {len(r.problems)} problem(s)[/]")
                print_table(
                    [Column("file"), Column("problem"), Column("expected"), Column("found")],
                    [(p.file, p.what, p.expected, p.found) for p in r.problems],
                )
            if r.unreadable:
                out.print(
                    f"[yellow]step {r.step}: {len(r.unreadable)} file(s) not readable by this user, not checked:[/] {escape(', '.join(r.unreadable))}"
                )
        for text in notes:
            note(text)
        if damaged:
            err.print(f"[yellow]hint:[/] {escape(f'run `ckpt rollback {directory} --auto` to move LATEST to the newest good checkpoint')}")
    if damaged:
        raise typer.Exit(ExitCode.FAILED)
    if unreadable:
        first = unreadable[0]
        raise CkptError(
            f"step {first.step}: permission denied reading {', '.join(first.unreadable[:3])}: not checked, and not damage",
            "run as the user who owns the checkpoint, or ask them to grant read access",
            ExitCode.USAGE,
        )


# --------------------------------------------------------------------------- verify
def verify(
    directory: Path = DirArg,
    step: int | None = typer.Option(None, "--step", min=0, max=layout.MAX_STEP, help="Verify this step (default: the one LATEST names)."),
    entry: str | None = typer.Option(
        None, "--entry", help="module:function returning (model, loss_fn); default: the manifest's, then [tool.ckpt] entry_point."
    ),
    nproc: int = typer.Option(
        1,
        "--nproc",
        min=1,
        help="Ranks: >1 runs the check under torchrun (FSDP-sharded load). The saved world size gives a bit-exact check.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Load the checkpoint into the model and recompute: step counter, probe loss, LR, gradient norm."""
    store = open_checkpoints(directory)
    step = resolve_step(store, step)
    entry = entry or store.read_manifest(step).entry_point or config.default("entry_point")
    if nproc == 1:
        from ckpt_tool.ops.verify import verify_checkpoint

        report = verify_checkpoint(store, step, entry).to_json()
    else:
        report = _verify_under_torchrun(directory, step, entry, nproc)
    failed = [f"{c['name']}: recorded {c['recorded']!r}, measured {c['measured']!r}" for c in report["checks"] if not c["ok"]]
    recorded = store.record_check(step, "verified", report["ok"], failed)
    if as_json:
        print_json(report | {"notes": [recorded] if recorded else []})
    else:
        verdict = "[green]pass[/]" if report["ok"] else "[bold red]FAIL[/]"
        if report["exact"]:
            how = "compared bit for bit (same world size, threads, torch and dtype as the save)"
        else:
            how = "compared within tolerance: " + "; ".join(report["differences"])
        out.print(f"verify step {step}: {verdict}, {escape(how)}")
        if report["reproduce"]:
            out.print(f"for a bit-exact check, reproduce the save: {escape(_reproduce_command(directory, step, report['reproduce']))}")
        print_table(
            [
                Column("check"),
                Column("recorded"),
                Column("measured"),
                Column("compared"),
                Column("result", styles={"pass": "green", "FAIL": "red"}),
            ],
            [(c["name"], c["recorded"], c["measured"], c["how"], "pass" if c["ok"] else "FAIL") for c in report["checks"]],
        )
        note(recorded)
    if not report["ok"]:
        raise typer.Exit(ExitCode.FAILED)


def _reproduce_command(directory: Path, step: int, reproduce: list[str]) -> str:
    """``OMP_NUM_THREADS=1 ckpt verify DIR --step 20 --nproc 2`` (+ a torch version to install)."""
    settings = [r for r in reproduce if not r.startswith("--") and not r.startswith("torch==")]
    options = [r for r in reproduce if r.startswith("--")]
    packages = [r for r in reproduce if r.startswith("torch==")]
    command = " ".join([*settings, "ckpt", "verify", str(directory), "--step", str(step), *options])
    return command + (f" with {', '.join(packages)} installed" if packages else "")


def _run_entry(module: str, nproc: int, args: list[str], what: str) -> dict[str, Any]:
    """Run an entry point of ``ckpt_tool.entrypoints`` under torchrun; it writes a JSON result,
    or its error with its exit code, which is raised here with the same message and code."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            module,
            str(result_path),
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not result_path.exists():
            raise CkptError(
                f"{what} under torchrun failed (exit {proc.returncode}) before it could report: {proc.stderr.strip()[-1500:]}",
                "run with --debug, or with one rank, to see the error directly",
                ExitCode.FAILED,
            )
        result = json.loads(result_path.read_text())
    if "error" in result:
        raise CkptError(result["error"], result.get("hint", ""), int(result.get("exit_code", ExitCode.FAILED)))
    return result


def _verify_under_torchrun(directory: Path, step: int, entry: str | None, nproc: int) -> dict[str, Any]:
    return _run_entry("ckpt_tool.entrypoints.verify", nproc, [str(directory), str(step), *([entry] if entry else [])], "verify")


# --------------------------------------------------------------------------- rollback
def rollback(
    directory: Path = DirArg,
    to: int | None = typer.Option(None, "--to", min=0, max=layout.MAX_STEP, help="Move LATEST to this step."),
    auto: bool = typer.Option(False, "--auto", help="Walk back from LATEST, validating and verifying each, until one passes."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; change nothing on disk."),
    entry: str | None = typer.Option(None, "--entry", help="Entry point for verification (default: the manifest's)."),
    reason: str = typer.Option("manual rollback", help="Recorded in the index with the event."),
    as_json: bool = JsonOpt,
) -> None:
    """Move LATEST back to a good checkpoint; newer ones are moved into quarantine/ (never deleted)."""
    from ckpt_tool.ops.rollback import rollback as do_rollback

    if to is not None and auto:
        raise CkptError("--to and --auto exclude each other", "give one of them", ExitCode.USAGE)
    report = do_rollback(open_checkpoints(directory), to, auto, dry_run, entry, reason)
    if as_json:
        print_json(report.to_json())
        return
    if report.attempts:
        print_table(
            [
                Column("step"),
                Column("valid", styles={"yes": "green", "no": "red"}),
                Column("verified", styles={"yes": "green", "no": "red"}),
                Column("problems"),
            ],
            [(a.step, a.valid, a.verified, "; ".join(a.problems[:3]) or "-") for a in report.attempts],
            title="checkpoints tried",
        )
    if report.latest_problem:
        out.print(f"[bold red]LATEST:[/] {escape(report.latest_problem)}")
    if report.target == report.previous_latest and not report.latest_problem:
        out.print(f"LATEST already names step {report.target}, which passed: nothing to do")
    elif report.previous_latest is None or report.latest_problem:
        out.print(f"{'would point' if dry_run else 'pointed'} LATEST at step {report.target}")
    else:
        out.print(f"{'would move' if dry_run else 'moved'} LATEST from step {report.previous_latest} to step {report.target}")
    if report.quarantined:
        out.print(
            f"{'would quarantine' if dry_run else 'quarantined'} steps {human(list(report.quarantined))} into {escape(str(directory / layout.QUARANTINE_NAME))}"
        )
    for text in report.notes:
        note(text)


# --------------------------------------------------------------------------- prune
def prune(
    directory: Path = DirArg,
    keep_last: int = typer.Option(
        ..., min=1, help="Keep the newest K checkpoints not known to be damaged (required: deleting has no default)."
    ),
    keep_every: int | None = typer.Option(None, min=1, help="Also keep every step divisible by M."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be deleted; delete nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Apply the retention policy by hand (never LATEST, never quarantined or damaged checkpoints).

    Before deleting anything, the newest checkpoint that would be kept is validated (hashes);
    one that fails is recorded invalid and no longer counts, so a directory is never left
    without a checkpoint that passes validation.
    """
    from ckpt_tool.training.validation import validate_checkpoint

    store = open_checkpoints(directory)
    notes: list[str] = []

    def confirm(step: int) -> bool:
        result = validate_checkpoint(store, step)
        if result.unreadable and not result.problems:
            raise store.permission_denied(store.step_path(step) / result.unreadable[0])
        if not dry_run:
            notes.append(store.record_check(step, "validated", result.ok, [str(p) for p in result.problems]) or "")
        if not result.ok:
            err.print(f"[yellow]step {step} failed validation:[/] {escape(str(result.problems[0]))}; it is kept and no longer counts")
        return result.ok

    victims = store.apply_retention(RetentionPolicy(keep_last, keep_every), dry_run=dry_run, confirm=confirm)
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "deleted": [] if dry_run else victims,
                "would_delete": victims if dry_run else [],
                "notes": [n for n in notes if n],
            }
        )
        return
    if not victims:
        out.print("nothing to delete")
    else:
        out.print(f"{'would delete' if dry_run else 'deleted'} steps {human(victims)}")
    for text in notes:
        note(text)


# --------------------------------------------------------------------------- reshard
def _check_out_dir(source: Path, out_dir: Path) -> None:
    """--out must be a new (or empty) directory apart from the source."""
    src, dst = source.resolve(), out_dir.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise CkptError(
            f"--out {out_dir} is the source directory {source} or overlaps it",
            "write the resharded copy to a new directory outside the source, e.g. --out ckpts-48",
            ExitCode.USAGE,
        )
    if dst.exists() and not dst.is_dir():
        raise CkptError(f"--out {out_dir} is a file", "give --out a new directory for the resharded copy", ExitCode.USAGE)
    if dst.is_dir() and os.listdir(dst):
        raise CkptError(
            f"--out {out_dir} is not empty",
            "give --out a new (or empty) directory: a resharded copy never mixes with other checkpoints",
            ExitCode.USAGE,
        )


def reshard(
    directory: Path = DirArg,
    world_size: int = typer.Option(..., "--world-size", min=1, help="The new number of data-parallel ranks."),
    step: int | None = typer.Option(None, "--step", min=0, max=layout.MAX_STEP, help="Default: the step LATEST names."),
    micro_batch: int | None = typer.Option(
        None, "--micro-batch", min=1, help="Micro-batch to use (must divide the per-rank batch; refused otherwise)."
    ),
    in_place: bool = typer.Option(False, "--in-place", help="Record the plan in the checkpoint's manifest lineage (used at resume)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Also write a copy laid out for the new world size into this new directory."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; write nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Check that a checkpoint loads at a new world size and plan the batch split that keeps the global batch."""
    from ckpt_tool.ops.reshard import check_reshard, record_plan

    if in_place and out_dir is not None:
        raise CkptError("--in-place and --out exclude each other", "give one of them", ExitCode.USAGE)
    store = open_checkpoints(directory)
    if out_dir is not None:
        _check_out_dir(directory, out_dir)
    report = check_reshard(store, resolve_step(store, step), world_size, micro_batch)
    if in_place and not dry_run:
        record_plan(store, report)
    if out_dir is not None and not dry_run:
        _run_entry(
            "ckpt_tool.entrypoints.reshard",
            world_size,
            [str(directory), str(report.step), str(out_dir), *([str(micro_batch)] if micro_batch else [])],
            "writing the resharded copy",
        )
    if as_json:
        print_json(
            report.to_json()
            | {"dry_run": dry_run, "recorded": in_place and not dry_run, "out": None if out_dir is None or dry_run else str(out_dir)}
        )
        return
    plan = report.plan.to_json()
    print_table(
        [
            Column(""),
            Column("world size", justify="right"),
            Column("micro-batch", justify="right"),
            Column("grad accumulation", justify="right"),
            Column("global batch", justify="right"),
        ],
        [
            (name, w, b["micro_batch"], b["grad_accum"], b["global_batch"])
            for name, b, w in (("old", plan["old"], report.old_world_size), ("new", plan["new"], report.new_world_size))
        ],
        title=f"reshard step {report.step}: {report.old_world_size} -> {report.new_world_size} ranks",
    )
    out.print(f"data position (global, unchanged): {escape(human(report.data_position))}")
    if out_dir is not None and not dry_run:
        out.print(
            f"wrote step {report.step} laid out for {world_size} ranks to {escape(str(out_dir))}; resume there with {world_size} ranks"
        )
    elif in_place and not dry_run:
        out.print("recorded in the manifest's lineage: resume the job at the new size")
    else:
        out.print("nothing written; resuming at the new size applies this plan automatically (--in-place records it)")
