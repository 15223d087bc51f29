"""``ckpt demo``: train the reference recipe, kill it with SIGKILL mid-run, resume, compare bit for bit."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import typer

from ckpt_tool.cli.output import Column, out, print_table
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.recipes.launch import FAST_ARGS, compare_runs, read_metrics, recipe_args, run, torchrun_command

console = out


def demo(
    nproc: int = typer.Option(2, help="Ranks (CPU processes, gloo, FSDP2)."),
    steps: int = typer.Option(40, min=2, help="Optimizer steps."),
    save_every: int = typer.Option(5, min=1, help="Checkpoint interval in steps."),
    crash_at: int = typer.Option(23, min=1, help="Step at whose start rank 0 is killed with SIGKILL."),
    async_save: bool = typer.Option(True, "--async-save/--sync-save", help="Save in the background (the default) or synchronously."),
    work_dir: Path = typer.Option(None, help="Where runs are written (default: a temporary directory, removed afterwards)."),
) -> None:
    """Crash-and-recover demo on the CPU: no cluster needed."""
    if crash_at > steps:
        raise CkptError(f"--crash-at {crash_at} is after the last step {steps}", "choose a crash step within the run", ExitCode.USAGE)
    root = work_dir or Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        _run_demo(root, nproc, steps, save_every, crash_at, async_save)
    finally:
        if work_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _launch(root: Path, name: str, nproc: int, steps: int, save_every: int, *extra: str) -> tuple[int, Path, Path]:
    ckpt, metrics, log = root / name / "ckpt", root / name / "metrics.jsonl", root / name / "log.txt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    code = run(torchrun_command(nproc, recipe_args(ckpt, metrics, steps, save_every, *FAST_ARGS, *extra)), log)
    return code, ckpt, metrics


def _run_demo(root: Path, nproc: int, steps: int, save_every: int, crash_at: int, async_save: bool) -> None:
    mode = ("--async-save",) if async_save else ()
    console.rule("[bold]ckpt-tool demo: crash and exact recovery")
    console.print(
        f"tiny GPT, {nproc} ranks (torchrun, gloo, FSDP2 on CPU), {steps} steps, {'async' if async_save else 'sync'} checkpoint every {save_every} steps"
    )
    with console.status("1/3 uninterrupted reference run..."):
        code, _, ref_metrics = _launch(root, "reference", nproc, steps, save_every, *mode)
    _check(code, root / "reference" / "log.txt")
    console.print(f"[green]1/3[/] reference run finished: {steps} steps")

    with console.status(f"2/3 run that is killed with SIGKILL at step {crash_at}..."):
        code, ckpt, metrics = _launch(root, "crashed", nproc, steps, save_every, "--crash-at-step", str(crash_at), *mode)
    if code == 0:
        raise CkptError("the crash run was not killed", "report this: the crash hook of the recipe did not fire", ExitCode.FAILED)
    from ckpt_tool.store.store import CheckpointStore

    latest = CheckpointStore(ckpt).read_latest()
    console.print(f"[red]2/3[/] rank 0 killed with SIGKILL at step {crash_at} (exit {code}); LATEST names step {latest}")

    with console.status("3/3 resuming from the newest valid checkpoint..."):
        code, _, _ = _launch(root, "crashed", nproc, steps, save_every, "--crash-at-step", str(crash_at), *mode)
    _check(code, root / "crashed" / "log.txt")
    console.print(f"[green]3/3[/] resumed from step {latest} and finished")

    reference, resumed = read_metrics(ref_metrics), read_metrics(metrics)
    comparison = compare_runs(reference, resumed)
    _print_table(reference, resumed, latest or 0, crash_at)
    if not comparison.identical:
        raise CkptError(
            f"{len(comparison.mismatches)} metric lines differ from the uninterrupted run",
            "see the table above; please report this",
            ExitCode.FAILED,
        )
    console.print(
        f"[bold green]bit-identical:[/] all {comparison.lines_compared} metric lines of the crashed-and-resumed run "
        f"({comparison.steps_compared} steps, {comparison.lines_compared - comparison.steps_compared} re-run after the crash) "
        "equal the uninterrupted run to the last bit (loss, lr, grad norm)"
    )


def _check(code: int, log: Path) -> None:
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise CkptError(
            f"a demo run failed with exit code {code}:\n{tail}", f"the full log is {log} (pass --work-dir to keep it)", ExitCode.FAILED
        )


def _print_table(reference, resumed, latest: int, crash_at: int) -> None:
    ref = {m.step: m for m in reference}
    last_seen: dict[int, object] = {m.step: m for m in resumed}  # the line that survives for each step
    rows = []
    for step in range(max(1, latest - 1), min(max(ref), crash_at + 3) + 1):
        r, c = ref[step], last_seen.get(step)
        rows.append((step, repr(r.loss), repr(c.loss) if c else "-", "yes" if c == r else "NO"))
    print_table(
        [
            Column("step", justify="right"),
            Column("reference loss", justify="right"),
            Column("after crash + resume", justify="right"),
            Column("loss, lr, grad norm same bits", "same_bits", justify="right", styles={"yes": "green", "NO": "red"}),
        ],
        rows,
        title=f"steps around the crash (resumed from checkpoint {latest})",
    )
