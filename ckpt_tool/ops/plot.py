"""``ckpt history --plot``: the run's story as a picture (PNG, SVG, PDF, JPEG... by the suffix) (matplotlib, the optional ``plot`` extra): the
loss by step, with every checkpoint, failure, requeue, rollback, shrink and straggler marked."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckpt_tool.core.history import KINDS, Story
from ckpt_tool.errors import CkptError, ExitCode

COLORS = {
    "checkpoint": "#2ca02c",
    "failure": "#d62728",
    "requeue": "#ff7f0e",
    "rollback": "#9467bd",
    "shrink": "#8c564b",
    "replace": "#17becf",
    "straggler": "#bcbd22",
}


def read_metrics(path: Path) -> list[tuple[int, float]]:
    """(step, loss) of each JSON line with both; other lines are skipped. The last line of a
    step wins (a step re-run after a resume)."""
    found: dict[int, float] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise CkptError(f"cannot read {path}: {exc.strerror or exc}", "give the metrics file the training writes", ExitCode.USAGE) from None
    for line in lines:
        try:
            row = json.loads(line)
            step, loss = row["step"], row["loss"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int) and isinstance(loss, (int, float)):
            found[step] = float(loss)
    if not found:
        raise CkptError(f"{path} has no JSON lines with a step and a loss", 'one line per step: {"step": 1, "loss": 2.3}', ExitCode.USAGE)
    return sorted(found.items())


# The formats a picture is written in, by the file's suffix (matplotlib writes each; jpg/webp/tiff through Pillow).
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", ".jpg": "jpg", ".jpeg": "jpg", ".webp": "webp", ".tif": "tiff", ".tiff": "tiff"}


def picture_format(out: Path, supported: Iterable[str]) -> str:
    """The format the file's suffix names, of those this matplotlib writes (``supported``); a
    bad path (a directory, no such parent, an unknown suffix) is a ``CkptError`` (exit 2)."""
    if out.is_dir():
        raise CkptError(f"--plot {out} is a directory", f"give a file name in it, e.g. --plot {out / 'story.png'}", ExitCode.USAGE)
    if not out.parent.is_dir():
        raise CkptError(f"{out.parent} is not a directory", "create it first, or give another path", ExitCode.USAGE)
    can = set(supported)
    known = [suffix for suffix, fmt in FORMATS.items() if fmt in can]
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None or fmt not in can:
        said = f"the suffix {out.suffix!r} names no picture format this can write" if out.suffix else "no suffix to name a picture format"
        raise CkptError(
            f"--plot {out}: {said}",
            f"end the name with one of {', '.join(known)} (e.g. {out.with_suffix('.png').name})",
            ExitCode.USAGE,
        )
    return fmt


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CkptError("drawing the picture needs matplotlib", "pip install 'ckpt-tool[plot]'", ExitCode.USAGE) from None
    return plt


def check_target(out: Path) -> str:
    """Before any work: the picture's format (from ``out``'s suffix), or why ``out`` cannot be one."""
    plt = _pyplot()
    fig = plt.figure()
    try:
        return picture_format(out, fig.canvas.get_supported_filetypes())
    finally:
        plt.close(fig)


def draw(story: Story, out: Path, title: str) -> None:
    """Write the picture to ``out`` in the format its suffix names (beside it first, then
    renamed in: a failed write leaves no half-written picture, and an older one as it was)."""
    fmt = check_target(out)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=100)
    if story.loss:
        steps, losses = zip(*story.loss, strict=True)
        ax.plot(steps, losses, color="#1f77b4", lw=1.3, marker="o" if len(steps) < 40 else None, ms=3, label=f"loss ({story.loss_source})")
    shown: set[str] = set()
    stacked: dict[int, int] = {}  # labels already at a step: the next one goes lower
    for m in story.marks:
        label = m.kind if m.kind not in shown else None
        shown.add(m.kind)
        if m.kind == "checkpoint":
            ax.axvline(m.step, color=COLORS[m.kind], lw=0.6, alpha=0.35, label=label)
            continue
        ax.axvline(m.step, color=COLORS[m.kind], lw=1.6, ls="--", label=label)
        level = stacked.get(m.step, 0)
        stacked[m.step] = level + 1
        y = 1.0 - 0.3 * (level % 3)
        ax.annotate(
            m.label, (m.step, y), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=7, color=COLORS[m.kind]
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i] not in KINDS, KINDS.index(labels[i]) if labels[i] in KINDS else 0))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper right", fontsize=8)
    fig.tight_layout()
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        fig.savefig(partial, format=fmt)
        os.replace(partial, out)
    except OSError as exc:
        raise CkptError(
            f"cannot write the picture to {out}: {exc.strerror or exc}",
            "free space there or give another --plot path (nothing was changed there)",
            ExitCode.FAILED,
        ) from None
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)
