"""``ckpt export / inspect``: what is inside a checkpoint, and out of it. Parse, call, print."""

from __future__ import annotations

from pathlib import Path

import typer

from ckpt_tool.cli.checkpoints import DirArg, JsonOpt, open_checkpoints, resolve_step
from ckpt_tool.cli.output import out, print_json, size


def export(
    directory: Path = DirArg,
    step: int | None = typer.Option(None, "--step", help="The step to export (default: LATEST)."),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors or torch (a torch.save file, loads with weights_only=True)."),
    out_path: Path | None = typer.Option(None, "--out", help="The file to write (default: ./DIRNAME-step-N.safetensors or .pt)."),
    model_only: bool = typer.Option(False, "--model-only", help="Only the model's tensors (default: the optimizer's too)."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
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
        f"exported {done.tensors} tensors ({size(done.bytes)}) of step {done.step} to {done.path} ({done.format}); every file hash-checked first"
    )
    if done.skipped:
        out.print(f"not exported: {len(done.skipped)} non-tensor entries (optimizer hyper-parameters, ...): see `ckpt inspect`")
