"""``ckpt list / validate / verify``: the commands that read a checkpoint directory (they work on one
the user may only read). Parse, call the layers below, print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ckpt_tool import config
from ckpt_tool.cli.options import DirArg, JsonOpt, step_option
from ckpt_tool.cli.output import Column, err, escape, note, out, print_json, print_table, size, when, when_short
from ckpt_tool.cli.targets import open_checkpoints, resolve_step
from ckpt_tool.cli.torchrun import run_entry
from ckpt_tool.errors import CkptError, ExitCode

if TYPE_CHECKING:  # the store is imported by the commands that validate (0.1 s: not for every `ckpt`)
    from ckpt_tool.store.store import ValidationResult

STATUS_STYLES = {
    "verified": "green",
    "local": "cyan",
    "validated": "green",
    "invalid": "red",
    "damaged": "red",
    "missing": "red",
    "quarantined": "red",
    "partial": "yellow",
    "deleting": "yellow",
}


# --------------------------------------------------------------------------- list
def list_checkpoints(
    directory: Path = DirArg,
    latest: bool = typer.Option(False, "--latest", metavar="", help="Print only the newest committed step (reads LATEST: constant time)."),
    as_json: bool = JsonOpt,
) -> None:
    """Show every checkpoint in DIR: step, status, LATEST, time, data size, mesh, global batch, probe loss.

    The data size counts the files the manifest lists and hashes; `ckpt du` counts every byte on disk."""
    store = open_checkpoints(directory)
    if latest:
        step = store.require_latest()
        print_json({"step": step}) if as_json else print(step)
        return
    from ckpt_tool.store.inventory import listing as take_listing  # the store: only for the commands that read it

    listing = take_listing(store)
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
        Column("latest", justify="center", terminal=lambda v: "*" if v else "", full=lambda v: "yes" if v else "no", no_wrap=True),
        Column("saved", "saved_at", terminal=when_short, full=when),
        # the checkpoint's files as its manifest lists and hashes them (`ckpt du`: all bytes on disk, the manifest too)
        Column("data", "bytes", justify="right", terminal=size, no_wrap=True),
        Column("mesh", no_wrap=True),
        Column("batch", "global_batch", justify="right"),
        Column("probe loss", justify="right", terminal=lambda v: "-" if v is None else f"{v:.6g}", no_wrap=True),
        Column("validated", "last_validated", terminal=when_short, full=when),
        Column("path", on_terminal=False),
    ]
    rows = [
        (
            r.step,
            r.status,
            r.latest,
            r.committed_at,
            r.bytes,
            r.mesh or _mesh_of(r.world_size),
            r.global_batch,
            r.probe_loss,
            r.last_validated,
            r.path,
        )
        for r in listing.rows
    ]
    print_table(columns, rows, title=f"checkpoints in {directory}")
    if listing.latest_problem:
        err.print(f"[bold red]LATEST:[/] {escape(listing.latest_problem)}")
        err.print(f"[yellow]hint:[/] {escape(f'run `ckpt rollback {directory} --auto` to point it at the newest valid checkpoint')}")
    for text in listing.notes:
        note(text)


def _mesh_of(world_size: int | None) -> str | None:
    """Index entries from before meshes were recorded: a 1-D FSDP mesh of the world size."""
    return None if world_size is None else f"dp_shard={world_size}"


# --------------------------------------------------------------------------- validate
def _problems_json(r: ValidationResult) -> dict[str, Any]:
    mesh = r.manifest.layout.compact() if r.manifest is not None else None
    return {"step": r.step, "ok": r.ok, "mesh": mesh, "problems": [p.__dict__ for p in r.problems], "unreadable": list(r.unreadable)}


def validate(
    directory: Path = DirArg,
    step: int | None = step_option("Validate this step (default: the one LATEST names)."),
    all_steps: bool = typer.Option(False, "--all", metavar="", help="Validate every committed checkpoint (scrubbing)."),
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
                mesh = f", mesh {escape(r.manifest.layout.describe())}" if r.manifest else ""
                out.print(f"[green]step {r.step}: valid[/] ({files} files, {size(r.manifest.total_bytes if r.manifest else 0)}{mesh})")
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
    step: int | None = step_option("Verify this step (default: the one LATEST names)."),
    entry: str | None = typer.Option(
        None, "--entry", help="module:function returning (model, loss_fn); default: the manifest's, then [tool.ckpt] entry_point."
    ),
    nproc: int = typer.Option(
        1,
        "--nproc",
        min=1,
        help="Ranks: >1 runs the check under torchrun (FSDP-sharded load). The saved mesh gives a bit-exact check.",
    ),
    tp: int | None = typer.Option(
        None,
        "--tp",
        min=1,
        help="Tensor-parallel size of the check's mesh (default: the saved one when it divides --nproc, else 1). "
        "A saved HSDP mesh's replicas are kept when they divide the rest.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Load the checkpoint into the model and recompute: step counter, probe loss, LR, gradient norm."""
    store = open_checkpoints(directory)
    step = resolve_step(store, step)
    manifest = store.read_manifest(step)
    from ckpt_tool.ops.verify import require_probe

    require_probe(manifest, directory)  # before asking for an entry point or starting torchrun
    entry = entry or manifest.entry_point or config.default("entry_point")
    tp = _verify_tp(tp, nproc, manifest.layout.size("tp"))
    saved_replicas = manifest.layout.size("dp_replicate")  # HSDP: checked on the saved replicas when they fit
    replicate = saved_replicas if (nproc // tp) % saved_replicas == 0 else 1
    if nproc == 1:
        from ckpt_tool.ops.verify import verify_checkpoint

        report = verify_checkpoint(store, step, entry).to_json()
    else:
        report = _verify_under_torchrun(directory, step, entry, nproc, tp, replicate)
    failed = [f"{c['name']}: recorded {c['recorded']!r}, measured {c['measured']!r}" for c in report["checks"] if not c["ok"]]
    recorded = store.record_check(step, "verified", report["ok"], failed)
    if as_json:
        print_json(report | {"notes": [recorded] if recorded else []})
    else:
        verdict = "[green]pass[/]" if report["ok"] else "[bold red]FAIL[/]"
        if report["exact"]:
            how = "compared bit for bit (same mesh, threads, torch and dtype as the save)"
        else:
            how = "compared within tolerance: " + "; ".join(report["differences"])
        out.print(f"verify step {step}: {verdict}, {escape(how)}")
        out.print(f"mesh: saved {escape(str(report['saved_mesh']))}, checked on {escape(str(report['mesh']))}")
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


def _verify_tp(tp: int | None, nproc: int, saved_tp: int) -> int:
    """``--tp``, or the saved tensor-parallel size when it divides ``--nproc`` (else 1)."""
    if tp is None:
        return saved_tp if nproc % saved_tp == 0 else 1
    if nproc % tp:
        raise CkptError(
            f"--tp {tp} does not divide --nproc {nproc}",
            f"give --nproc a multiple of {tp} (e.g. --nproc {tp * max(1, nproc // tp)}), or another --tp",
            ExitCode.USAGE,
        )
    return tp


def _verify_under_torchrun(directory: Path, step: int, entry: str | None, nproc: int, tp: int, replicate: int) -> dict[str, Any]:
    args = [str(directory), str(step), str(tp), str(replicate), *([entry] if entry else [])]
    return run_entry("ckpt_tool.entrypoints.verify", nproc, args, "verify")
