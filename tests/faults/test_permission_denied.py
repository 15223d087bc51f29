"""Another user's checkpoint directory: a clear error, exit code 2, nothing changed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..as_nobody import cli_as_nobody
from ..integration.tiny import make_trainer

pytestmark = [pytest.mark.faults, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def private_ckpt(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    root = tmp_path / "private"
    t = make_trainer(root / "ckpt", save_every=1)
    t.step()
    t.manager.maybe_save(1)
    t.manager.close()
    os.chmod(tmp_path, 0o755)
    os.chmod(root, 0o700)  # root's; user nobody cannot enter
    return root / "ckpt"


@pytest.mark.parametrize("args", [("list",), ("validate",), ("rollback", "--auto")])
def test_permission_denied_is_a_clear_error(private_ckpt, args):
    before = sorted(os.listdir(private_ckpt))
    code, stderr = cli_as_nobody([args[0], str(private_ckpt), *args[1:]], private_ckpt)
    assert code == 2, stderr
    assert "permission denied" in stderr and "Traceback" not in stderr
    assert sorted(os.listdir(private_ckpt)) == before


def test_debug_shows_the_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "list", str(tmp_path / "missing"), "--debug"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "does not exist" in proc.stderr
