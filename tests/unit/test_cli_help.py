"""Every command's --help as a user reads it: no value shown for a flag, arguments named in capitals."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer

from ckpt_tool.cli.app import app


def _commands(group, path=()):
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


COMMANDS = sorted(_commands(typer.main.get_command(app)))


def _help(*words: str) -> str:
    env_cols = {"COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", *words, "--help"], capture_output=True, text=True, env={**env_cols, "PATH": ""}
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_command_is_walked():
    assert ("list",) in COMMANDS and ("quarantine", "restore") in COMMANDS and ("run",) in COMMANDS and len(COMMANDS) >= 20


@pytest.mark.parametrize("words", [(), *COMMANDS], ids=lambda w: " ".join(w) or "ckpt")
def test_help_shows_no_value_after_a_flag_and_capital_argument_names(words):
    text = _help(*words)
    assert "<bool>" not in text
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    for name in re.findall(r"[{\[]([A-Za-z_]+)[}\]]", usage):
        assert name in ("OPTIONS", "ARGS") or name.isupper(), usage


def _all_commands(group, path=()):
    """Every command, the hidden ones (`ckpt job`, `ckpt note`: run by the batch script) too."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _all_commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_no_bracketed_words_of_a_docstring_are_eaten_as_markup():
    """Rich reads `[words]` in a command's docstring as a markup tag and drops it from --help
    (`ckpt job --help` lost "[ckpt job=ID restart=N HH:MM:SS]"): such brackets are escaped."""
    from typer.testing import CliRunner

    runner = CliRunner()
    lost = []
    for words, command in _all_commands(typer.main.get_command(app)):
        doc = (command.help or "").replace("\\[", "[")
        shown = " ".join(runner.invoke(app, [*words, "--help"], env={"COLUMNS": "300"}).output.split())
        lost += [(" ".join(words), seg) for seg in re.findall(r"\[[^\]]*\]", doc) if " ".join(seg.split()) not in shown]
    assert not lost, f"bracketed text missing from --help (escape it as \\\\[ in the docstring): {lost}"


def test_a_docstrings_paragraph_reads_as_one_paragraph_not_its_source_lines():
    """Typer's rich mode keeps every newline of a docstring: at any width each source line broke the
    text again ("... a rank stopped on an error a" / "restart cannot fix ..."). A paragraph is
    reflowed; a list item keeps its own line."""
    from ckpt_tool.cli.help import reflow

    text = _help("run")
    assert "2, 3 or 4 a rank stopped on an error a restart cannot fix (its message is in the events)" in text, text
    assert reflow("First line\nof a paragraph.\n\nNext one\nhere.\n- an item\n- another") == (
        "First line of a paragraph.\n\nNext one here.\n- an item\n- another"
    )
    assert reflow(None) is None and reflow("one") == "one"
