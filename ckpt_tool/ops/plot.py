"""``ckpt history --plot``: the run's story as a picture (PNG, SVG, PDF, JPEG... by the suffix;
matplotlib, the optional ``plot`` extra). On a wall-clock axis: the step reached against time,
the time lost shaded by kind (detection, restart, queue, load, recompute, a stop's checkpoint),
each interruption numbered and said in a list beside, checkpoints as ticks; one lane per node
(active, standby, left behind); below, the loss by step. The title says the run and its ETTR."""

from __future__ import annotations

import datetime
import json
import os
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckpt_tool.core.account import Account, duration
from ckpt_tool.core.history import Story
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


# the account's kinds of time: how each is shaded (productive time is the progress line itself)
SHADES = {
    "overhead": ("#d9d9d9", "job start and end"),
    "checkpoint": ("#2ca02c", "checkpoint (training blocked)"),
    "detection": ("#d62728", "detection"),
    "restart": ("#ff7f0e", "restart"),
    "queue": ("#9467bd", "queued after a requeue"),
    "load": ("#17becf", "load"),
    "recompute": ("#e377c2", "recompute (lost steps)"),
}
LANE_COLORS = {"active": "#2ca02c", "standby": "#aec7e8", "left behind": "#7f7f7f"}
MAX_LISTED = 12  # interruptions said in words beside the picture (the rest counted)
MAX_LINES = 44  # lines of words beside the picture
RUG_ABOVE = 60  # more checkpoints than this: a rug along the bottom instead of ticks on the line


def _stagger(xs: list[float], gap: float, levels: int = 3) -> list[int]:
    """A level for each label at ``xs`` (sorted) so that labels closer than ``gap`` do not overlap."""
    out: list[int] = []
    last: dict[int, float] = {}
    for x in xs:
        level = next((lv for lv in range(levels) if x - last.get(lv, -float("inf")) >= gap), len(out) % levels)
        last[level] = x
        out.append(level)
    return out


def draw(story: Story, out: Path, title: str, acct: Account | None = None) -> None:
    """Write the picture to ``out`` in the format its suffix names (beside it first, then
    renamed in: a failed write leaves no half-written picture, and an older one as it was).
    Without an account (no job ran under ``ckpt run``), the loss by step alone."""
    fmt = check_target(out)
    plt = _pyplot()
    if acct is None or not acct.spans:
        fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
        _loss_panel(ax, story)
        ax.set_title(title, fontsize=10)
    else:
        fig = _story_figure(plt, story, acct, title)
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


def _loss_panel(ax: Any, story: Story) -> None:
    """The loss by step, checkpoints as ticks on the x axis."""
    if story.loss:
        steps, losses = zip(*story.loss, strict=True)
        ax.plot(
            steps, losses, color="#1f77b4", lw=1.2, marker="o" if len(steps) < 40 else None, ms=2.5, label=f"loss ({story.loss_source})"
        )
        ax.legend(loc="upper right", fontsize=8)
    ticks = sorted({m.step for m in story.marks if m.kind == "checkpoint"})
    if ticks:
        many = len(ticks) > RUG_ABOVE
        ax.plot(ticks, [0.0] * len(ticks), "|", color=SHADES["checkpoint"][0], ms=7 if many else 9, mew=0.6 if many else 1.0,
                alpha=0.6 if many else 1.0, transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
    if not story.loss:
        ax.text(
            0.5, 0.5, "no loss recorded: --metrics FILE (JSON lines with step and loss)", transform=ax.transAxes, ha="center", fontsize=8
        )
    ax.set_xlabel("step (ticks: checkpoints)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.25)


def _story_figure(plt: Any, story: Story, acct: Account, title: str) -> Any:
    """Progress against wall-clock time with the lost time shaded, the node lanes, the loss by step."""
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    def at(t: float) -> float:
        return float(mdates.date2num(datetime.datetime.fromtimestamp(t)))  # local time, as ckpt history prints it

    lanes = list(acct.lanes.items())
    fig = plt.figure(figsize=(13, 8.5), dpi=100)
    grid = fig.add_gridspec(
        3, 2, height_ratios=[3.2, 0.35 + 0.28 * max(1, len(lanes)), 2.0], width_ratios=[3.3, 1.0], hspace=0.35, wspace=0.04
    )
    ax = fig.add_subplot(grid[0, 0])
    lane_ax = fig.add_subplot(grid[1, 0], sharex=ax)
    loss_ax = fig.add_subplot(grid[2, 0])
    words, key = fig.add_subplot(grid[0:2, 1]), fig.add_subplot(grid[2, 1])
    words.axis("off")
    key.axis("off")

    # progress, the lost time shaded, checkpoints as ticks
    shown: set[str] = set()
    for s in acct.spans:
        if s.kind in SHADES:
            color, label = SHADES[s.kind]
            ax.axvspan(at(s.start), at(s.end), color=color, alpha=0.28 if s.kind != "overhead" else 0.5, lw=0)
            shown.add(s.kind)
    for i, run in enumerate(acct.progress):
        xs, ys = [at(t) for t, _ in run], [st for _, st in run]
        ax.plot(xs, ys, color="#1f77b4", lw=1.6, label="step reached" if i == 0 else None)
    if acct.checkpoints:  # ticks on the line while they can be told apart, else a rug along the bottom
        at_x = [at(t) for t, _ in acct.checkpoints]
        if len(acct.checkpoints) <= RUG_ABOVE:
            ax.plot(at_x, [st for _, st in acct.checkpoints], "|", color="#2ca02c", ms=8, mew=1.5, label="checkpoint committed")
        else:
            ax.plot(at_x, [0.015] * len(at_x), "|", color="#2ca02c", ms=7, mew=0.6, alpha=0.6, transform=ax.get_xaxis_transform(),
                    label=f"checkpoints ({len(at_x)})")  # fmt: skip
    ax.set_ylabel("step")
    ax.grid(alpha=0.25)
    ax.tick_params(labelbottom=False)
    xs = [at(i.time) for i in acct.interruptions]
    lo, hi = at(acct.start), at(acct.end)
    for i, x, level in zip(acct.interruptions, xs, _stagger(xs, (hi - lo) * 0.025), strict=True):
        ax.annotate(
            str(i.index + 1), (x, 0.985 - 0.075 * level), xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=8, fontweight="bold",
            color="white", bbox={"boxstyle": "circle,pad=0.2", "fc": "#d62728", "ec": "none"},
        )  # fmt: skip
    handles, labels = ax.get_legend_handles_labels()
    handles += [Patch(color=SHADES[k][0], alpha=0.45, label=SHADES[k][1]) for k in SHADES if k in shown]
    key.legend(handles=handles, loc="upper left", fontsize=7.5, ncol=1, frameon=False, title="the time", title_fontsize=8)
    ax.set_xlim(lo, hi)

    # one lane per node
    for row, (_, segments) in enumerate(lanes):
        for start, end, state in segments:
            lane_ax.broken_barh([(at(start), at(end) - at(start))], (row - 0.35, 0.7), color=LANE_COLORS.get(state, "#cccccc"),
                                hatch="//" if state == "left behind" else None, edgecolor="white", lw=0.5)  # fmt: skip
    lane_ax.set_yticks(range(len(lanes)), [n for n, _ in lanes], fontsize=8)
    lane_ax.set_ylim(-0.6, max(1, len(lanes)) - 0.4)
    lane_ax.invert_yaxis()
    lane_ax.legend(
        handles=[Patch(color=c, label=k) for k, c in LANE_COLORS.items()],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=3,
        fontsize=7.5,
        frameon=False,
    )
    locator = mdates.AutoDateLocator()
    lane_ax.xaxis.set_major_locator(locator)
    lane_ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    lane_ax.set_xlabel("wall-clock time")
    if not lanes:
        lane_ax.text(0.5, 0.5, "one node (no node changes recorded)", transform=lane_ax.transAxes, ha="center", va="center", fontsize=8)

    _loss_panel(loss_ax, story)

    # the interruptions in words, and the account
    totals = acct.totals()
    lines = [f"{duration(acct.wall_s)} wall time:"]
    lines += [f"  {k:<10} {duration(v):>8}  {v / (acct.wall_s or 1):6.1%}" for k, v in totals.items() if v > 0]
    lines.append("")
    for i in acct.interruptions[:MAX_LISTED]:
        text = f"{i.index + 1}. {i.label}"
        text += f": {duration(i.down_s)} down" + (f", {i.steps_recomputed} steps redone" if i.steps_recomputed else "")
        if i.then:
            text += "; " + "; ".join(i.then)
        lines.append(text)
    if len(acct.interruptions) > MAX_LISTED:
        lines.append(f"... and {len(acct.interruptions) - MAX_LISTED} more (ckpt history)")
    wrapped = [w for line in lines for w in (textwrap.wrap(line, 46, subsequent_indent="    ") or [""])]
    if len(wrapped) > MAX_LINES:
        wrapped = [*wrapped[: MAX_LINES - 1], "... (ckpt history lists them all)"]
    words.text(0.02, 1.0, "\n".join(wrapped), va="top", ha="left", fontsize=7.5, family="monospace", transform=words.transAxes)
    ettr = acct.ettr
    fig.suptitle(
        f"{title}\nETTR {ettr:.1%}"
        + (f" ({acct.ettr_nodes:.1%} of the node-hours)" if acct.shrank and acct.ettr_nodes is not None else "")
        + f" over {duration(acct.wall_s)}: {acct.summary().split(', ETTR')[0]}"
        if ettr is not None
        else title,
        fontsize=10,
    )
    return fig
