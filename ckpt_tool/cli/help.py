"""How ``ckpt --help`` reads: Typer's own rendering, without the ``<bool>`` it writes after every
flag (a flag takes no value). Every command and group of the CLI is made with these classes."""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup


def _flags_without_value(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # the help shows no value column for it
    return params


class Command(TyperCommand):
    """A ``ckpt`` command (``app.command(..., cls=Command)``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        """Typer's parameters, the flags without a value placeholder in the help."""
        return _flags_without_value(super().get_params(ctx))


class Group(TyperGroup):
    """A group of ``ckpt`` commands (``typer.Typer(cls=Group)``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        """Typer's parameters, the flags without a value placeholder in the help."""
        return _flags_without_value(super().get_params(ctx))
