"""The ``ckpt`` entry point: version, help, completion, and where ``--debug`` is taken from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tool import __version__
from ckpt_tool.cli.app import main as whole_cli
from ckpt_tool.cli.app import split_debug
from ckpt_tool.cli.main import answered_at_once, main


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
        "79 a wrong value",
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


@pytest.mark.parametrize(
    "argv, at_once",
    [
        (["free-port"], True),
        (["note", "run", "job_start", "job_id=7", "restarts=0"], True),
        (["note", "run", "requeue"], True),
        (["free-port", "--help"], False),
        (["note", "run"], False),  # missing EVENT: the whole CLI's usage error
        (["note", "", "x"], False),
        (["note", "run", "x", "--debug"], False),
        (["--debug", "note", "run", "x"], False),
        (["list", "d"], False),
        ([], False),
    ],
)
def test_only_the_batch_scripts_own_call_shapes_skip_the_whole_cli(argv, at_once):
    assert answered_at_once(argv) is at_once


@pytest.mark.parametrize("entry", [main, whole_cli], ids=["at-once", "whole-cli"])
def test_note_appends_the_same_record_either_way(tmp_path, entry):
    with pytest.raises(SystemExit) as exit_info:
        entry(["note", str(tmp_path / "run"), "requeue", "restarts=1", "reason=stopped by USR1", "flag"])
    assert exit_info.value.code in (0, None)
    [record] = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert record.pop("time") > 0
    assert record == {"event": "requeue", "restarts": "1", "reason": "stopped by USR1", "flag": ""}


@pytest.mark.parametrize("entry", [main, whole_cli], ids=["at-once", "whole-cli"])
def test_note_into_a_run_dir_that_cannot_be_made_is_a_usage_error(capsys, tmp_path, entry):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit) as exit_info:
        entry(["note", str(blocker / "run"), "job_start"])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_info.value.code == 2
    assert f"cannot append to {blocker / 'run' / 'events.jsonl'}" in err and "hint:" in err
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize(
    "option, expected",
    [
        (["--straggler-threshold", "1.5"], "between 0 and 1"),
        (["--straggler-threshold", "nan"], "between 0 and 1"),
        (["--straggler-seconds", "-1"], "straggler seconds must be between 0 and 3600"),
        (["--straggler-seconds", "inf"], "straggler seconds must be between 0 and 3600"),
        (["--straggler-seconds", "1e9"], "straggler seconds must be between 0 and 3600"),
        (["--straggler-steps", "0"], "--straggler-steps"),
    ],
)
def test_a_straggler_policy_that_cannot_work_is_refused_before_anything_starts(capsys, tmp_path, option, expected):
    code, _, err = ckpt(capsys, "run", "--run-dir", str(tmp_path / "run"), *option, "--", "-m", "ckpt_tool.recipes.tiny_gpt")
    assert code == 2 and expected in " ".join(err.split()), err
    assert "hint:" in err or "Invalid value" in err  # ours says what to use; typer's names the range
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    "command, expected",
    [
        (["-m", "no_such_module_xyz", "--steps", "9"], "no module 'no_such_module_xyz'"),
        (["-m", "no_such_module_xyz.train"], "no module 'no_such_module_xyz'"),
        (["trian.py", "--steps", "9"], "no training script trian.py"),
    ],
)
def test_a_mistyped_training_module_or_script_is_refused_before_anything_starts(capsys, tmp_path, monkeypatch, command, expected):
    """Else every rank fails at import, and torchrun restarts them all --max-restarts times."""
    monkeypatch.chdir(tmp_path)
    code, _, err = ckpt(capsys, "run", "--run-dir", str(tmp_path / "run"), "--", *command)
    assert code == 2 and expected in " ".join(err.split()) and "hint:" in err, err
    assert not (tmp_path / "run").exists()


def test_a_training_module_next_to_the_user_is_found_as_torchrun_will(tmp_path, monkeypatch):
    from ckpt_tool.slurm.submit import missing_module

    def found(name: str) -> bool:  # as `ckpt run` asks: from the working directory, imported not run
        return missing_module(name, Path.cwd(), run=False) is None

    (tmp_path / "mytrain.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    assert found("mytrain") and found("ckpt_tool.recipes.tiny_gpt") and found("json")
    assert not found("no_such_module_xyz") and not found("not-a-name")


def test_the_ranks_error_line_is_found_in_torchruns_output():
    from ckpt_tool.core.torchrun_output import ranks_error

    stderr = (
        '[rank0]:   File "/work/train.py", line 26, in <module>\n'
        "[rank0]: ValueError: invalid literal for int() with base 10: 'ck'\n"
        "E1203 12:28:03.595000 24278 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
    )
    assert ranks_error(stderr) == "ValueError: invalid literal for int() with base 10: 'ck'"
    assert ranks_error("just this\n\n") == "just this"
    assert ranks_error("") == "no output"
    # a checkpoint found damaged while loading comes first, then a ckpt-tool error as the recipes print it
    ours = "rank 1: error: LATEST names step 15, which is not a committed checkpoint\n" + stderr
    assert ranks_error(ours) == "LATEST names step 15, which is not a committed checkpoint"
    no_script = "[rank0]: /usr/bin/python3.11: can't open file '/x/train.py': [Errno 2] No such file or directory\n" + stderr
    assert ranks_error(no_script) == "can't open file '/x/train.py': [Errno 2] No such file or directory"
    damaged = "ckpt: checkpoint step 15 is damaged (verify loss: recorded 5.2, measured 5.1 (exact)): quarantining it\n" + ours
    assert ranks_error(damaged) == "checkpoint step 15 is damaged (verify loss: recorded 5.2, measured 5.1 (exact)): quarantining it"


def test_an_entry_points_unexpected_error_is_reported_with_where_not_lost(tmp_path, capsys):
    """A rank's bug (or the user's model code) reaches the command as a message, not as the
    scraped tail of torchrun's output."""
    import json

    from ckpt_tool.entrypoints import run_and_report

    def body():
        raise ValueError("boom")

    assert run_and_report(tmp_path / "r.json", body) == 1
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["error"].startswith("rank 0 failed: ValueError: boom at ") and "test_cli_main.py line" in result["error"]
    assert result["exit_code"] == 1 and "--debug" in result["hint"]
    assert "Traceback" in capsys.readouterr().err  # the ranks' own output keeps it
