"""`ckpt submit` refuses a training command the job could not start, at submit time, looked up
from the directory the job starts in (sbatch's: the submit's, or --chdir), not after the queue wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tool.cli.main import main
from ckpt_tool.slurm.submit import job_workdir, missing_module


def submit(capsys, tmp_path, *args: str, dry_run: bool = False) -> tuple[int, str, str]:
    """``ckpt submit``: a refusal comes before sbatch; an accepted command is only dry-run."""
    with pytest.raises(SystemExit) as e:
        main(["submit", "--ckpt-dir", str(tmp_path / "ckpts"), *(["--dry-run"] if dry_run else []), *args])
    out, err = capsys.readouterr()
    return e.value.code or 0, out, " ".join(err.split())


def test_a_missing_script_is_refused_at_submit_time(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = submit(capsys, tmp_path, "--", "nonexistent_script.py", "--steps", "9")
    assert code == 2 and not out
    assert "no training script nonexistent_script.py" in err and f"where the job starts: {tmp_path}" in err and "hint:" in err, err
    assert not (tmp_path / "ckpts").exists()  # no script written, nothing noted


def test_a_dry_run_shows_the_script_and_warns(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = submit(capsys, tmp_path, "--", "nonexistent_script.py", dry_run=True)
    assert code == 0 and "nonexistent_script.py" in out
    assert "warning: no training script nonexistent_script.py" in err and "the job would fail" in err, err


def test_a_missing_module_is_refused_at_submit_time(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = submit(capsys, tmp_path, "--", "-m", "no.such.module")
    assert code == 2 and not out and "no module 'no'" in err and "where the job starts" in err and "-m" in err, err


def test_the_script_is_looked_up_where_the_job_starts(capsys, tmp_path, monkeypatch):
    """--sbatch --chdir=DIR: the job starts in DIR, the script is looked for there."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = submit(capsys, tmp_path, "--", "train.py")
    assert code == 2 and "no training script train.py" in err, err
    code, out, err = submit(capsys, tmp_path, "--sbatch", f"--chdir={tmp_path / 'work'}", "--", "train.py", dry_run=True)
    assert code == 0 and "train.py" in out and "warning" not in err, err
    monkeypatch.chdir(tmp_path / "work")
    code, _, err = submit(capsys, tmp_path, "--", "train.py", dry_run=True)
    assert code == 0 and "warning" not in err, err


def test_a_module_next_to_the_job_is_found_and_a_package_needs_its_main(tmp_path):
    (tmp_path / "mytrain.py").write_text("")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('not to be run by the lookup')\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "train.py").write_text("")
    assert missing_module("mytrain", tmp_path) is None
    assert missing_module("pkg.sub.train", tmp_path) is None  # pkg/__init__.py not run
    assert missing_module("pkg.sub.nope", tmp_path) == "pkg.sub.nope"
    assert missing_module("pkg.sub", tmp_path) == "pkg.sub.__main__" and missing_module("pkg.sub", tmp_path, run=False) is None
    assert missing_module("mytrain.x", tmp_path) == "mytrain.x"  # a module has no submodules
    assert missing_module("json.tool", tmp_path) is None and missing_module("not-a-name", tmp_path) == "not-a-name"
    assert missing_module("mytrain", tmp_path / "elsewhere") == "mytrain"


@pytest.mark.parametrize(
    "lines, expected",
    [((), "."), (("--chdir=/w",), "/w"), (("--chdir /w",), "/w"), (("-D /w",), "/w"), (("#SBATCH -Drel",), "rel"), (("--exclusive",), ".")],
)
def test_job_workdir_reads_chdir_from_the_extra_directives(lines, expected):
    assert job_workdir(lines, Path("/submit")) == Path("/submit") / expected
