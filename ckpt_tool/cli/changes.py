"""``ckpt rollback / prune / reshard``: the commands that change a checkpoint directory (each has a
``--dry-run`` that changes nothing). Parse, call the layers below, print."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ckpt_tool.cli.options import DirArg, JsonOpt, step_option
from ckpt_tool.cli.output import Column, err, escape, human, note, out, plural, print_json, print_table, steps_text
from ckpt_tool.cli.targets import open_checkpoints, resolve_step
from ckpt_tool.cli.torchrun import run_entry
from ckpt_tool.core import layout
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import CkptError, ExitCode

if TYPE_CHECKING:
    from ckpt_tool.ops.reshard import ReshardReport
    from ckpt_tool.store.store import CheckpointStore


# --------------------------------------------------------------------------- rollback
def rollback(
    directory: Path = DirArg,
    to: int | None = typer.Option(None, "--to", min=0, max=layout.MAX_STEP, help="Move LATEST to this step."),
    auto: bool = typer.Option(False, "--auto", metavar="", help="Walk back from LATEST, validating and verifying each, until one passes."),
    dry_run: bool = typer.Option(False, "--dry-run", metavar="", help="Say what would happen; change nothing on disk."),
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
            f"{'would quarantine' if dry_run else 'quarantined'} {steps_text(report.quarantined)} into {escape(str(directory / layout.QUARANTINE_NAME))}"
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
    dry_run: bool = typer.Option(False, "--dry-run", metavar="", help="List what would be deleted; delete nothing."),
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

    from ckpt_tool.core.index import known_invalid
    from ckpt_tool.store.prune import prune as prune_store  # this command is `prune` too

    latest = store.read_latest()
    if latest is None and store.committed_on_disk():
        store.require_latest()  # retention keeps everything without LATEST: say why and how to repair it
    invalid = sorted(known_invalid(store.events()) & set(store.committed_on_disk()))  # before this prune's own checks
    victims = prune_store(store, RetentionPolicy(keep_last, keep_every), dry_run=dry_run, confirm=confirm)
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "deleted": [] if dry_run else victims,
                "would_delete": victims if dry_run else [],
                "not_counted": invalid,
                "latest_invalid": latest in invalid,
                "notes": [n for n in notes if n],
            }
        )
        return
    if invalid:
        which = ", ".join(f"{s} (LATEST)" if s == latest else str(s) for s in invalid)
        err.print(
            f"[yellow]recorded invalid:[/] {'step' if len(invalid) == 1 else 'steps'} {which}: kept, and not counted by --keep-last {keep_last}"
        )
    if latest in invalid:
        err.print(
            f"[yellow]hint:[/] {escape(f'LATEST names a damaged checkpoint: run `ckpt rollback {directory} --auto` to move it to the newest good one')}"
        )
    if not victims:
        out.print("nothing to delete")
    else:
        out.print(f"{'would delete' if dry_run else 'deleted'} {steps_text(victims)}")
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


def write_copy(store: CheckpointStore, report: ReshardReport, out_dir: Path, micro_batch: int | None, one_process: bool | None) -> None:
    """``--out``: in this process, or under torchrun with one process per new rank."""
    import psutil

    from ckpt_tool.core.reshard_plan import copy_in_one_process
    from ckpt_tool.training.config import DEFAULT_IO_THREADS

    tp = report.new_mesh.size("tp")
    state_bytes = store.read_manifest(report.step).total_bytes
    if copy_in_one_process(state_bytes, psutil.virtual_memory().available, one_process):
        from ckpt_tool.entrypoints.reshard_copy import reshard_in_one_process

        reshard_in_one_process(store.root, report.step, out_dir, report.new_world_size, tp, micro_batch, DEFAULT_IO_THREADS)
        return
    run_entry(
        "ckpt_tool.entrypoints.reshard_copy",
        report.new_world_size,
        [str(store.root), str(report.step), str(out_dir), str(tp), *([str(micro_batch)] if micro_batch else [])],
        "writing the resharded copy",
    )


def reshard(
    directory: Path = DirArg,
    world_size: int = typer.Option(..., "--world-size", min=1, help="The new number of ranks (processes), all mesh dimensions together."),
    tp: int | None = typer.Option(
        None, "--tp", min=1, help="The new tensor-parallel size (default: the saved one); data parallel takes the rest."
    ),
    step: int | None = step_option("The step to reshard (default: the one LATEST names)."),
    micro_batch: int | None = typer.Option(
        None, "--micro-batch", min=1, help="Micro-batch to use (must divide the per-rank batch; refused otherwise)."
    ),
    in_place: bool = typer.Option(
        False, "--in-place", metavar="", help="Record the plan in the checkpoint's manifest lineage (used at resume)."
    ),
    out_dir: Path | None = typer.Option(None, "--out", help="Also write a copy laid out for the new world size into this new directory."),
    one_process: bool | None = typer.Option(
        None,
        "--one-process/--per-rank",
        metavar="",
        help="Write the --out copy from this process (the whole state in memory, each byte read once) or from one process per "
        "new rank under torchrun. Default: one process when the state takes at most half the available memory.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", metavar="", help="Print the plan; write nothing."),
    as_json: bool = JsonOpt,
) -> None:
    """Check that a checkpoint loads on a new mesh and plan the batch split that keeps the global batch."""
    from ckpt_tool.ops.reshard import check_reshard, record_plan

    if in_place and out_dir is not None:
        raise CkptError("--in-place and --out exclude each other", "give one of them", ExitCode.USAGE)
    if one_process is not None and out_dir is None:
        flag = "--one-process" if one_process else "--per-rank"
        raise CkptError(
            f"{flag} says how the --out copy is written, and no --out was given", f"add --out DIR2, or drop {flag}", ExitCode.USAGE
        )
    store = open_checkpoints(directory)
    if out_dir is not None:
        _check_out_dir(directory, out_dir)
    report = check_reshard(store, resolve_step(store, step), world_size, micro_batch, None if tp is None else {"tp": tp})
    if in_place and not dry_run:
        record_plan(store, report)
    if out_dir is not None and not dry_run:
        write_copy(store, report, out_dir, micro_batch, one_process)
    if as_json:
        print_json(
            report.to_json()
            | {"dry_run": dry_run, "recorded": in_place and not dry_run, "out": None if out_dir is None or dry_run else str(out_dir)}
        )
        return
    plan = report.plan.to_json()
    meshes = plan["mesh"]
    print_table(
        [
            Column(""),
            Column("world size", justify="right"),
            Column("mesh"),
            Column("micro-batch", justify="right"),
            Column("grad accumulation", justify="right"),
            Column("global batch", justify="right"),
        ],
        [
            (name, w, meshes[name], b["micro_batch"], b["grad_accum"], b["global_batch"])
            for name, b, w in (("old", plan["old"], report.old_world_size), ("new", plan["new"], report.new_world_size))
        ],
        title=f"reshard step {report.step}: {report.old_world_size} -> {plural(report.new_world_size, 'rank')}",
    )
    out.print(f"data position (global, unchanged): {escape(human(report.data_position))}")
    if out_dir is not None and not dry_run:
        out.print(
            f"wrote step {report.step} laid out for {plural(world_size, 'rank')} ({escape(report.new_mesh.describe())}) to {escape(str(out_dir))}; "
            f"resume there with {plural(world_size, 'rank')} and tp {report.new_mesh.size('tp')}"
        )
    elif in_place and not dry_run:
        out.print("recorded in the manifest's lineage: resume the job at the new size")
    else:
        out.print("nothing written; resuming at the new size applies this plan automatically (--in-place records it)")


# --------------------------------------------------------------------------- adopt
def adopt(
    source: Path = typer.Argument(
        ..., metavar="SOURCE", help="The weights: a dcp.save directory, a .safetensors or a torch .pt file.", show_default=False
    ),
    directory: Path = typer.Argument(
        ..., metavar="DIR", help="A new (or empty) checkpoint directory for the run to start from.", show_default=False
    ),
    step: int = step_option("The step the run continues after.", default=0),
    as_json: bool = JsonOpt,
) -> None:
    """Make pretrained weights the first checkpoint of a run: the run's resume() loads them as initial weights."""
    from ckpt_tool.ops.adopt import adopt as do_adopt

    manifest = do_adopt(source, directory, step)
    origin = manifest.lineage[-1]
    if as_json:
        print_json({"directory": str(directory), "step": step, "run_id": manifest.run_id, **{k: origin[k] for k in ("format", "tensors")}})
        return
    out.print(
        f"adopted {origin['tensors']} tensors ({origin['format']}) from {escape(str(source))} as step {step} of {escape(str(directory))}; "
        f"a run with --ckpt-dir {escape(str(directory))} starts from them (fresh optimizer, its own seeds and batch)"
    )
