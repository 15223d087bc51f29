"""The checkpoint commands' trust fixes (#30), each on real checkpoints of the reference recipe
(steps 5, 10, 15, 20 written by 2 ranks), run as a user runs them: the installed ``ckpt`` in a
process of its own, from a working directory outside the source tree."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tool.core import layout

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

CKPT = Path(sys.executable).with_name("ckpt")  # the console script: sys.path[0] is its bin directory, not the cwd


def ckpt_in(cwd: Path, *args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """`ckpt ARGS` run from ``cwd`` (outside the source tree), output as a pipe sees it."""
    return subprocess.run([str(CKPT), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def said(proc: subprocess.CompletedProcess) -> str:
    """stdout and stderr, whitespace folded (Rich may wrap a long line)."""
    return " ".join((proc.stdout + proc.stderr).split())


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with a hash of its content: any change shows."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


@pytest.fixture
def away(tmp_path) -> Path:
    """A working directory that is not the source tree."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd


# ------------------------------------------------------------------ 1. one range check for --step
@pytest.mark.parametrize("command", ["export", "inspect", "validate", "verify", "reshard"])
@pytest.mark.parametrize("step", ["-1", "100000000"])
def test_every_step_option_refuses_a_step_out_of_range_without_a_traceback(ckpt, away, command, step):
    extra = ("--world-size", "1") if command == "reshard" else ()
    before = snapshot(ckpt)
    proc = ckpt_in(away, command, ckpt, "--step", step, *extra)
    assert proc.returncode == 2, said(proc)
    assert "Traceback" not in said(proc) and "ValueError" not in said(proc), said(proc)
    assert "--step" in said(proc) and ("99999999" in said(proc) or "0" in said(proc)), said(proc)
    assert snapshot(ckpt) == before
    assert not list(away.iterdir())  # no export file begun


def test_adopt_refuses_a_step_out_of_range(ckpt, away, tmp_path):
    proc = ckpt_in(away, "adopt", ckpt / layout.step_dir_name(20), tmp_path / "new", "--step", "100000000")
    assert proc.returncode == 2 and "--step" in said(proc) and "Traceback" not in said(proc), said(proc)
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ 2. output paths that are directories or files
@pytest.mark.parametrize("force", [(), ("--force",)])
def test_export_out_that_is_a_directory_is_refused_and_left_alone(ckpt, away, force):
    target = away / "weights"
    (target / "keep").mkdir(parents=True)
    proc = ckpt_in(away, "export", ckpt, "--out", target, *force)
    assert proc.returncode == 2, said(proc)
    assert "IsADirectoryError" not in said(proc) and "Traceback" not in said(proc), said(proc)
    assert f"--out {target} is a directory" in said(proc) and "give a file name" in said(proc), said(proc)
    assert sorted(p.name for p in target.iterdir()) == ["keep"]


def test_adopt_into_an_existing_file_is_refused_and_the_file_kept(ckpt, away):
    existing = away / "notes.txt"
    existing.write_text("mine\n")
    proc = ckpt_in(away, "adopt", ckpt / layout.step_dir_name(20), existing)
    assert proc.returncode == 2, said(proc)
    assert "NotADirectoryError" not in said(proc) and "Traceback" not in said(proc), said(proc)
    assert f"{existing} is a file, not a directory" in said(proc) and "new (or empty) directory" in said(proc), said(proc)
    assert existing.read_text() == "mine\n" and sorted(p.name for p in away.iterdir()) == ["notes.txt"]
