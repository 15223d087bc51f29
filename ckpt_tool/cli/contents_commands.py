"""``ckpt export / inspect / diff / du / quarantine``: what is inside a checkpoint directory, and out of it.
Parse, call, print."""

from __future__ import annotations

from pathlib import Path

import typer

from ckpt_tool.cli.help import Command, Group
from ckpt_tool.cli.options import DirArg, JsonOpt, step_option
from ckpt_tool.cli.output import Column, escape, out, print_json, print_table, size, when
from ckpt_tool.cli.targets import checkpoint_at, open_checkpoints, resolve_step
from ckpt_tool.core.ckpt_diff import EntryDiff
from ckpt_tool.errors import ExitCode


def export(
    directory: Path = DirArg,
    step: int | None = step_option("The step to export (default: the one LATEST names)."),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors or torch (a torch.save file, loads with weights_only=True)."),
    out_path: Path | None = typer.Option(None, "--out", help="The file to write (default: ./DIRNAME-step-N.safetensors or .pt)."),
    model_only: bool = typer.Option(False, "--model-only", metavar="", help="Only the model's tensors (default: the optimizer's too)."),
    force: bool = typer.Option(False, "--force", metavar="", help="Replace --out if it exists."),
    as_json: bool = JsonOpt,
) -> None:
    """Consolidated full tensors of a (sharded) checkpoint in one file: hash-checked first, no pickle run, tensor by tensor."""
    from ckpt_tool.ops.export import export_checkpoint, return_freed_memory

    return_freed_memory()
    store = open_checkpoints(directory)
    chosen = resolve_step(store, step)
    target = out_path or Path(f"{store.root.resolve().name}-step-{chosen}.{'safetensors' if fmt == 'safetensors' else 'pt'}")
    done = export_checkpoint(store, chosen, fmt, target, model_only, force)
    if as_json:
        print_json(
            {
                "path": str(done.path),
                "step": done.step,
                "format": done.format,
                "tensors": done.tensors,
                "bytes": done.bytes,
                "not_exported": list(done.skipped),
            }
        )
        return
    out.print(
        f"exported {done.tensors} tensors ({size(done.bytes)}) of step {done.step} to {escape(str(done.path))} ({done.format}); every file hash-checked first"
    )
    if done.skipped:
        out.print(
            f"not exported: {len(done.skipped)} entries that are no weights (optimizer hyper-parameters, the probe batch...): see `ckpt inspect`"
        )


CkptArg = typer.Argument(..., metavar="A", help="A step directory (CKPT_DIR/step_00000010), or a checkpoint directory.", show_default=False)
OtherArg = typer.Argument(..., metavar="B", help="The other checkpoint, named the same ways.", show_default=False)


def diff(
    a: Path = CkptArg,
    b: Path = OtherArg,
    step_a: int | None = typer.Option(None, "--step-a", help="A's step, when A is a checkpoint directory (default: its LATEST)."),
    step_b: int | None = typer.Option(None, "--step-b", help="B's step, when B is a checkpoint directory (default: its LATEST)."),
    all_entries: bool = typer.Option(False, "--all", metavar="", help="List identical entries too (default: only those that differ)."),
    as_json: bool = JsonOpt,
) -> None:
    """How two checkpoints differ, entry by entry: identical, or the largest absolute and relative difference; shape, dtype, mesh.

    Of one run (two steps) or two (two variants, a replay). Both are hash-checked first; read a
    batch of tensors at a time. Exit 0: every entry identical; 1: they differ; 2/3: see the message.
    """
    from ckpt_tool.ops.diff import diff_checkpoints

    store_a, sa = checkpoint_at(a, step_a)
    store_b, sb = checkpoint_at(b, step_b)
    report = diff_checkpoints(store_a, sa, store_b, sb)
    if as_json:
        print_json(report.to_json())
    else:
        for side, f in (("A", report.a), ("B", report.b)):
            out.print(f"{side}: {escape(f['path'])} (run {escape(f['run_id'])}, step {f['step']}, mesh {escape(f['mesh_text'])})")
        shown = [e for e in report.entries if all_entries or e.status != "identical"]
        if shown:
            print_table(
                [
                    Column("key"),
                    Column("status"),
                    Column("differing", justify="right"),
                    Column("max_abs", justify="right"),
                    Column("max_rel", justify="right"),
                    Column("shape/dtype"),
                ],  # fmt: skip
                [_diff_row(e) for e in shown],
            )
        out.print(escape(report.summary()))
    if not report.identical:
        raise typer.Exit(ExitCode.FAILED)


def _shape(shape: tuple[int, ...] | None) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def _diff_row(e: EntryDiff) -> list[object]:
    n = e.numbers
    if e.status in ("shape", "dtype"):
        what = f"{_shape(e.shape_a)} {e.dtype_a} -> {_shape(e.shape_b)} {e.dtype_b}"
    else:
        shape, dtype = (e.shape_a, e.dtype_a) if e.shape_a is not None else (e.shape_b, e.dtype_b)
        what = f"{_shape(shape)} {dtype}"
    if n is None:
        return [e.key, e.status, "-", "-", "-", what]
    nan = f" ({n.nan_mismatch} NaN)" if n.nan_mismatch else ""
    return [e.key, e.status, f"{n.differing}/{n.elements}{nan}", f"{n.max_abs:.3g}", f"{n.max_rel:.3g}", what]


def inspect(
    directory: Path = DirArg,
    step: int | None = step_option("The step to inspect (default: the one LATEST names)."),
    as_json: bool = JsonOpt,
) -> None:
    """Entries (key, shape, dtype, bytes, how they are split across ranks) and the run facts of a checkpoint."""
    from ckpt_tool.ops.contents import inspect_step

    store = open_checkpoints(directory)
    report = inspect_step(store, resolve_step(store, step))
    if as_json:
        print_json(report)
        return
    m = report["manifest"]
    out.print(
        f"step {report['step']} of run {escape(m['run_id'])}, written {when(m['created_at'])} by {m['world_size']} ranks "
        f"(mesh {escape(m['mesh_text'])}); {report['tensors']} tensors, {size(report['tensor_bytes'])} in {m['files']} files ({size(m['file_bytes'])})"
    )
    env = m["env"]
    out.print(
        f"torch {escape(str(env.get('torch', '-')))}, dtype {escape(str(env.get('dtype', '-')))}, threads {env.get('threads', '-')}; entry point {escape(str(m['entry_point'] or '-'))}"
    )
    print_table(
        [
            Column("key"),
            Column("shape"),
            Column("dtype"),
            Column("bytes", justify="right", terminal=size, full=lambda v: "-" if v is None else str(v)),
            Column("placement"),
        ],
        [
            (
                e["key"],
                "x".join(map(str, e["shape"])) if e["shape"] is not None else "object",
                e["dtype"] or "-",
                e["bytes"],
                e["placement"],
            )
            for e in report["entries"]
        ],
        title="entries (placement: how the saved chunks split each tensor)",
    )


def du(directory: Path = DirArg, as_json: bool = JsonOpt) -> None:
    """Bytes on disk per checkpoint (every file, its manifest too), per quarantined checkpoint, saves in progress and the run directory.

    `ckpt list` shows a checkpoint's data: the files its manifest lists and hashes."""
    from ckpt_tool.ops.contents import disk_usage

    rows = disk_usage(open_checkpoints(directory))
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["kind"]] = totals.get(r["kind"], 0) + r["bytes"]
    if as_json:
        print_json({"entries": rows, "totals": totals, "total": sum(totals.values())})
        return
    print_table(
        [Column("name"), Column("kind"), Column("on disk", "bytes", justify="right", terminal=size, full=str)],
        [(r["name"], r["kind"], r["bytes"]) for r in rows],
    )
    out.print(
        "  ".join(f"{k}: {size(v)}" for k, v in sorted(totals.items()))
        + f"  (total {size(sum(totals.values()))}; node-local fast-tier copies are on the nodes: `ckpt list`)"
    )


quarantine_app = typer.Typer(
    help="Checkpoints moved aside as damaged or superseded: list, restore, purge.", no_args_is_help=True, cls=Group
)


@quarantine_app.command("list", cls=Command)
def quarantine_list(directory: Path = DirArg, as_json: bool = JsonOpt) -> None:
    """What quarantine/ holds: step, when it was moved, why, bytes."""
    from ckpt_tool.ops.contents import quarantined

    rows = quarantined(open_checkpoints(directory))
    if as_json:
        print_json({"quarantined": [r.to_json() for r in rows]})
        return
    if not rows:
        out.print("quarantine is empty")
        return
    print_table(
        [
            Column("name"),
            Column("step"),
            Column("moved", terminal=when, full=when),
            Column("bytes", justify="right", terminal=size, full=str),
            Column("reason"),
        ],
        [(r.item.name, r.item.step, r.item.moved_ns / 1e9, r.bytes, r.reason or "-") for r in rows],
    )


@quarantine_app.command("restore", cls=Command)
def quarantine_restore(
    directory: Path = DirArg,
    which: str = typer.Argument(
        ...,
        metavar="NAME_OR_STEP",
        help="The quarantined checkpoint: its name, or its step when only one of that step is there.",
        show_default=False,
    ),
    dry_run: bool = typer.Option(False, "--dry-run", metavar="", help="Say what would happen; change nothing on disk."),
    as_json: bool = JsonOpt,
) -> None:
    """Move a quarantined checkpoint back to its step directory and validate it there (LATEST is not moved)."""
    from ckpt_tool.ops.contents import restore

    row, result = restore(open_checkpoints(directory), which, dry_run)
    valid = None if result is None else result.ok
    step_dir = f"step_{row.item.step:08d}"
    if as_json:
        problems = [] if result is None else [str(p) for p in result.problems]
        print_json({"restored": row.to_json(), "dry_run": dry_run, "valid": valid, "problems": problems})
    elif result is None:
        out.print(f"would restore {escape(row.item.name)} as {step_dir}")
    else:
        verdict = "valid" if result.ok else f"[red]damaged[/]: {escape('; '.join(str(p) for p in result.problems[:3]))}"
        latest = open_checkpoints(directory).latest_or_none()
        out.print(f"restored {escape(row.item.name)} as {step_dir} ({verdict}); LATEST unchanged")
        out.print(f"[yellow]hint:[/] {escape(restore_hint(directory, row.item.step, result.ok, latest))}")
    if valid is False:
        raise typer.Exit(ExitCode.FAILED)  # restored as asked, but what came back is damaged


def restore_hint(directory: Path, step: int, valid: bool, latest: int | None) -> str:
    """What can be done with a restored checkpoint: only a valid one can become LATEST
    (`ckpt rollback --to` refuses a damaged one); an older one moves the newer steps aside."""
    if not valid:
        return (
            f"a damaged checkpoint cannot become LATEST (`ckpt rollback --to {step}` refuses it); "
            f"`ckpt validate {directory} --step {step}` lists its problems"
        )
    if latest is not None and step < latest:
        return f"`ckpt rollback {directory} --to {step}` makes it LATEST and moves the newer steps into quarantine"
    if latest == step:
        return "LATEST already names it"
    return f"`ckpt rollback {directory} --to {step}` makes it LATEST"


@quarantine_app.command("purge", cls=Command)
def quarantine_purge(
    directory: Path = DirArg,
    older_than: float | None = typer.Option(None, "--older-than", min=0, help="Only those moved there more than this many days ago."),
    dry_run: bool = typer.Option(False, "--dry-run", metavar="", help="Say what would be deleted; delete nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Delete quarantined checkpoints for good (only when asked: nothing else ever deletes them)."""
    from ckpt_tool.ops.contents import purge

    gone = purge(open_checkpoints(directory), older_than, dry_run)
    if as_json:
        key = "would_delete" if dry_run else "deleted"
        print_json({key: [r.to_json() for r in gone], "dry_run": dry_run, "bytes": sum(r.bytes for r in gone)})
        return
    names = escape(", ".join(r.item.name for r in gone) or "nothing")
    out.print(f"{'would delete' if dry_run else 'deleted'} {names} ({size(sum(r.bytes for r in gone))})")
