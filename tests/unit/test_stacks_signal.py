"""The stacks signal (SIGRTMIN+4) never kills a rank: CI saw `ckpt stacks` reach a rank that was
exiting, after faulthandler had given the signal back its default action (terminate), and the
rank 'vanished without a word'. Armed, the signal dumps the stacks; before arming and after
faulthandler lets go, it is ignored. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from ckpt_tool.supervise.stacks import STACKS_SIGNAL

SCRIPT = textwrap.dedent(
    """
    import faulthandler, os, sys, time
    from ckpt_tool.supervise import stacks
    path = stacks.arm(0)
    os.kill(os.getpid(), stacks.STACKS_SIGNAL)  # armed: the stacks are dumped
    time.sleep(0.2)
    faulthandler.unregister(stacks.STACKS_SIGNAL)  # what interpreter shutdown does
    os.kill(os.getpid(), stacks.STACKS_SIGNAL)  # a late request: ignored, not fatal
    time.sleep(0.2)
    print(open(path).read().count("Current thread") + open(path).read().count("Thread 0x"))
    """
)


def test_a_late_stacks_request_is_ignored_not_fatal(tmp_path):
    env = {**os.environ, "CKPT_STACKS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -(SIGRTMIN+4) before the fix
    assert int(done.stdout.strip()) >= 1  # the armed request did dump


def test_a_process_ckpt_run_starts_ignores_the_signal_until_it_arms():
    from ckpt_tool.supervise.processes import ignore_job_signals

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=ignore_job_signals)
    try:
        os.kill(child.pid, STACKS_SIGNAL)
        os.kill(child.pid, signal.SIGUSR1)
        assert child.poll() is None or child.wait(1) is None
    except subprocess.TimeoutExpired:
        pass  # still running: both signals ignored
    finally:
        alive = child.poll() is None
        child.kill()
        child.wait()
    assert alive
