"""After `ckpt submit`, the commands it prints to follow the job paste into a shell as they are:
a checkpoint directory with spaces and a quote is one argument (before: `ckpt status /a b'c`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ckpt_tool.core.render import follow_up_commands


def test_follow_up_commands_are_quoted_for_a_shell():
    then = follow_up_commands("42", "/shared/my run's ckpts")
    assert shlex.split(then["status"]) == ["ckpt", "status", "/shared/my run's ckpts"]
    assert shlex.split(then["history"]) == ["ckpt", "history", "/shared/my run's ckpts"] and then["queue"] == "squeue -j 42"


def test_the_printed_commands_work_when_pasted_into_bash(tmp_path):
    """A real `ckpt submit` (sbatch stood in for at the command boundary: it prints a job id),
    from another directory; each printed line is run through `bash -c` as a user pastes it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    ckpt_dir = tmp_path / "my run's [ckpts] x"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "submit", "--ckpt-dir", str(ckpt_dir), "--", "train.py"],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "4242", proc.stderr
    lines = dict(re.findall(r"^\s*(follow|history):\s+(ckpt .*)$", proc.stderr, re.MULTILINE))
    assert set(lines) == {"follow", "history"}, proc.stderr
    for name, command in lines.items():
        assert command == follow_up_commands("4242", str(ckpt_dir))["status" if name == "follow" else name]
        pasted = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
        assert pasted.returncode == 0, pasted.stderr
        assert ("job 4242" if name == "follow" else "submitted") in pasted.stdout, pasted.stdout
