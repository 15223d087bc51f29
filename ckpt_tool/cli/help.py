"""How ``ckpt --help`` reads: Typer's own rendering, without the ``<bool>`` it writes after every
flag (a flag takes no value), and with each paragraph of a docstring reflowed (Typer's rich mode
keeps every source line break). Every command and group of the CLI is made with these classes."""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperCommand, TyperGroup


def _flags_without_value(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # the help shows no value column for it
    return params


_OWN_LINE = re.compile(r"^\s*(?:[-*]|\d+\.)\s|^\s{2,}")  # a list item or an indented line keeps its line


def reflow(text: str | None) -> str | None:
    """``text`` with the lines of each paragraph joined by a space, but a list item's (``- x``,
    ``1. x``) or an indented line's; paragraphs stay apart."""
    if not text:
        return text
    paragraphs = []
    for paragraph in text.strip().split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not _OWN_LINE.match(line):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line.rstrip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


class Command(TyperCommand):
    """A ``ckpt`` command (``app.command(..., cls=Command)``); its help reflowed (``reflow``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        """Typer's parameters, the flags without a value placeholder in the help."""
        return _flags_without_value(super().get_params(ctx))


class Group(TyperGroup):
    """A group of ``ckpt`` commands (``typer.Typer(cls=Group)``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        """Typer's parameters, the flags without a value placeholder in the help."""
        return _flags_without_value(super().get_params(ctx))
