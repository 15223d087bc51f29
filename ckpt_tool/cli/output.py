"""How the ``ckpt`` commands print.

- On a terminal: Rich tables and colours. In a pipe or a file: whole lines, full values, tables
  as tab-separated columns with a header (like ``squeue``), so ``ckpt list DIR | grep`` works.
- ``--json`` on every command that reports: one JSON document on stdout.
- Text that comes from the user or the disk (paths, messages, step names) is never read as Rich
  markup: ``exp[lr=3e-4]`` stays ``exp[lr=3e-4]``. Only this module's callers' own markup is.
- No Python reprs in human output: ``None`` is ``-``, mappings are ``key value, ...``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ckpt_tool.errors import CkptError

# soft_wrap: a line is never cut or folded to the (unknown) width of a pipe
out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)

__all__ = [
    "out",
    "err",
    "escape",
    "Column",
    "print_table",
    "print_json",
    "note",
    "human",
    "when",
    "when_short",
    "size",
    "shorten",
    "plural",
    "steps_text",
    "is_terminal",
]


def is_terminal() -> bool:
    """Whether stdout is a terminal (Rich tables and colours) rather than a pipe or a file (whole lines,
    tab-separated tables)."""
    return out.is_terminal


def human(value: Any) -> str:
    """A value as a person reads it: no ``None``, no dict or dataclass reprs."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {human(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(human(v) for v in value) or "-"
    return str(value)


def when(t: float | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in local time for epoch seconds ``t``; ``-`` when unknown (None or 0)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def when_short(t: float | None) -> str:
    """``MM-DD HH:MM:SS`` in local time for epoch seconds ``t`` (a narrow table cell); ``-`` when unknown."""
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def size(n: int | None) -> str:
    """``n`` bytes in decimal units (``512 B``, ``1.5 GB``; TB is the largest); ``-`` for None."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return "-"


def plural(n: int, word: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def steps_text(steps: Iterable[int]) -> str:
    """``step 40``, ``steps 5, 10, 15`` (sorted), ``no step``."""
    ordered = sorted(steps)
    if not ordered:
        return "no step"
    return ("step " if len(ordered) == 1 else "steps ") + ", ".join(map(str, ordered))


def shorten(text: str, limit: int) -> str:
    """At most ``limit`` characters; a cut text ends with an ellipsis."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


@dataclass(frozen=True)
class Column:
    """One column of ``print_table``: its title on a terminal, its one-word header in a pipe (``key``), how
    a cell is shown on a terminal (``terminal``) and in a pipe (``full``: the whole value), and the Rich
    style of each cell text on a terminal."""

    title: str
    key: str = ""  # the header in a pipe (one word); default: the title with underscores
    justify: str = "left"
    terminal: Callable[[Any], str] = human  # how a cell looks on a terminal
    full: Callable[[Any], str] = human  # and in a pipe: the full value
    styles: Mapping[str, str] = field(default_factory=dict)  # cell text -> Rich style (terminal)
    on_terminal: bool = True  # False: only in a pipe (e.g. a path the terminal view does not need)
    no_wrap: bool = False  # never folded or cut on a terminal (short keys such as a status)

    @property
    def header(self) -> str:
        """The column's header in a pipe: ``key``, or the title with its spaces as underscores."""
        return self.key or self.title.replace(" ", "_")


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A Rich table on a terminal; tab-separated lines with a header elsewhere (no title)."""
    if not is_terminal():
        lines = ["\t".join(c.header for c in columns)]
        lines += ["\t".join(c.full(v).replace("\t", " ").replace("\n", " ") for c, v in zip(columns, row, strict=True)) for row in rows]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    shown = [i for i, c in enumerate(columns) if c.on_terminal]
    table = Table(title=Text(title) if title is not None else None, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i in shown:
        c = columns[i]
        table.add_column(Text(c.title), justify=c.justify, no_wrap=c.no_wrap)  # type: ignore[arg-type]
    for row in rows:
        cells = []
        for i in shown:
            text = columns[i].terminal(row[i])
            cells.append(Text(text, style=columns[i].styles.get(text, "")))
        table.add_row(*cells)
    out.print(table)


def print_json(obj: Any) -> None:
    """Write ``obj`` to stdout as one indented JSON document (values JSON cannot hold as their ``str``), not
    through Rich."""
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def note(text: str | None) -> None:
    """A ``note:`` line on stderr (nothing for an empty one): something a command recorded or noticed."""
    if text:
        err.print(f"[yellow]note:[/] {escape(text)}")


def print_error(exc: CkptError) -> None:
    """A ``CkptError`` as the CLI says it, on stderr: ``error: MESSAGE`` and ``hint: HINT``."""
    err.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        err.print(f"[yellow]hint:[/] {escape(exc.hint)}")
