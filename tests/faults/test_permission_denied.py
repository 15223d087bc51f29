"""Another user's checkpoint directory: a clear error, exit code 2, nothing changed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


def run_as_nobody(argv: list[str]) -> tuple[int, str]:
    """Run the CLI's main() in a forked child that dropped to user nobody (the interpreter lives
    under /root, which nobody cannot exec, so the child keeps the already-loaded one)."""
    import io
    import pwd
    from contextlib import redirect_stderr

    from ckpt_tool.cli.main import main

    # Load every module the command needs while we may still read the interpreter's files.
    with redirect_stderr(io.StringIO()):
        try:
            main([argv[0], "/nonexistent-ckpt-dir", *argv[2:]])
        except SystemExit:
            pass
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        code = 99
        err = io.StringIO()
        try:
            nobody = pwd.getpwnam("nobody")
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with redirect_stderr(err):
                main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            err.write(f"Traceback: {exc!r}")
        os.write(write_fd, f"{code}\n{err.getvalue()}".encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        out = f.read()
    os.waitpid(pid, 0)
    code, _, stderr = out.partition("\n")
    return int(code), stderr


@pytest.mark.parametrize("args", [("list",), ("validate",), ("rollback", "--auto")])
def test_permission_denied_is_a_clear_error(private_ckpt, args):
    before = sorted(os.listdir(private_ckpt))
    code, stderr = run_as_nobody([args[0], str(private_ckpt), *args[1:]])
    assert code == 2, stderr
    assert "permission denied" in stderr and "Traceback" not in stderr
    assert sorted(os.listdir(private_ckpt)) == before


def test_debug_shows_the_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ckpt_tool.cli.main", "list", str(tmp_path / "missing"), "--debug"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "does not exist" in proc.stderr
