"""`ckpt history --plot`: the format the suffix names (or a refusal), a directory refused, and no
half-written picture when the disk is full (a real small tmpfs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")


def ckpt_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, timeout=180, cwd=cwd
    )


def test_plot_writes_the_format_its_suffix_names(ckpt, tmp_path):
    for name, magic in (("story.jpg", b"\xff\xd8\xff"), ("story.svg", b"<?xml"), ("story.pdf", b"%PDF"), ("story.png", b"\x89PNG")):
        proc = ckpt_cli("history", ckpt, "--plot", name, cwd=tmp_path)  # relative to the user's directory
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / name).read_bytes()[: len(magic)] == magic, name
        assert f"picture written to {name}" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial left


def test_plot_refuses_a_directory_and_a_suffix_it_cannot_write(ckpt, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    proc = ckpt_cli("history", ckpt, "--plot", here, cwd=here)
    assert proc.returncode == 2 and f"--plot {here} is a directory" in proc.stderr and f"{here / 'story.png'}" in proc.stderr
    assert "Traceback" not in proc.stderr and list(here.iterdir()) == []
    for name, said in (("story.txt", "the suffix '.txt' names no picture format"), ("story", "no suffix to name a picture format")):
        proc = ckpt_cli("history", ckpt, "--plot", name, cwd=here)
        err = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and said in err and ".png, .svg, .pdf, .jpg" in err, err
        assert list(here.iterdir()) == []


@pytest.fixture
def full_disk(tmp_path, small_tmpfs):
    return small_tmpfs(tmp_path / "small", "24k")


def test_a_full_disk_leaves_the_older_picture_as_it_was(ckpt, full_disk, tmp_path):
    old = full_disk / "story.png"
    old.write_bytes(b"the older picture")
    proc = ckpt_cli("history", ckpt, "--plot", old, cwd=tmp_path)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and f"cannot write the picture to {old}: No space left on device" in err and "Traceback" not in err
    assert old.read_bytes() == b"the older picture" and [p.name for p in full_disk.iterdir()] == ["story.png"]
