"""`ckpt run` refuses a rendezvous torchrun cannot use before anything starts: exit 2, the
accepted form, and nothing recorded (before: torchrun's traceback through every restart, exit 1,
a `failed` event in the run's history)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "options, words",
    [
        (("--nnodes", "abc"), "--nnodes 'abc' is not a node count: give N or MIN:MAX"),
        (("--nnodes", "3:1"), "--nnodes '3:1': need 1 <= MIN <= MAX"),
        (("--nnodes", "2"), "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        (("--nnodes", "2", "--rdzv-endpoint", "node1:port"), "the port 'port' is not a number from 1 to 65535"),
        (("--rdzv-endpoint", "node1:99999"), "not a number from 1 to 65535"),
        (("--rdzv-endpoint", "no de:29500"), "'no de' is not a host name or address"),
    ],
)
def test_a_rendezvous_torchrun_cannot_use_is_refused_before_anything_starts(tmp_path, options, words):
    (tmp_path / "train.py").write_text("print('trained')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "run", "--run-dir", str(tmp_path / "run"), *options, "--", "train.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and words in err and "hint:" in err, err
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()  # nothing started, nothing recorded
