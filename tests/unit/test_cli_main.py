"""The ``ckpt`` entry point: version, help, completion, and where ``--debug`` is taken from."""

from __future__ import annotations

import pytest

from ckpt_tool import __version__
from ckpt_tool.cli.main import main, split_debug


def ckpt(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def test_version(capsys):
    code, out, _ = ckpt(capsys, "--version")
    assert (code, out.strip()) == (0, f"ckpt-tool {__version__}")


def test_help_shows_exit_codes_debug_and_completion(capsys):
    code, out, _ = ckpt(capsys, "--help")
    text = " ".join(out.split())
    assert code == 0
    for words in (
        "Exit codes",
        "3 no checkpoint directory",
        "4 the checkpoint does not fit",
        "75",
        "76",
        "--debug",
        "--install-completion",
        "--version",
    ):
        assert words in text, words


@pytest.mark.parametrize(
    "argv, kept, debug",
    [
        (["--debug", "list", "d"], ["list", "d"], True),
        (["list", "d", "--debug", "--json"], ["list", "d", "--json"], True),
        (
            ["submit", "--ckpt-dir", "x", "--debug", "--", "train.py", "--debug"],
            ["submit", "--ckpt-dir", "x", "--", "train.py", "--debug"],
            True,
        ),
        (["submit", "--ckpt-dir", "x", "--", "train.py", "--debug"], ["submit", "--ckpt-dir", "x", "--", "train.py", "--debug"], False),
        (["submit", "--ckpt-dir", "x", "train.py", "--debug"], ["submit", "--ckpt-dir", "x", "train.py", "--debug"], False),
        (
            ["run", "--nproc-per-node", "2", "--", "-m", "mod", "--debug"],
            ["run", "--nproc-per-node", "2", "--", "-m", "mod", "--debug"],
            False,
        ),
        (["run", "--run-dir", "--debug", "--", "t.py"], ["run", "--run-dir", "--debug", "--", "t.py"], False),  # a value, not the flag
    ],
)
def test_debug_is_taken_only_from_ckpts_own_options(argv, kept, debug):
    assert split_debug(argv) == (kept, debug)


def test_the_training_commands_debug_flag_reaches_the_script(capsys, tmp_path):
    code, out, err = ckpt(capsys, "submit", "--ckpt-dir", str(tmp_path / "c"), "--dry-run", "--", "train.py", "--debug")
    assert code == 0, err
    assert "train.py --debug" in out
