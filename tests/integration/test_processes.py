"""Tearing process trees down (ckpt_tool.supervise.processes), with real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from ckpt_tool.supervise.processes import kill_tree

# A parent that ignores SIGTERM and has a child that ignores it too (a stuck rank and its worker).
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
    "print('ready', flush=True); time.sleep(600)\n"
)
POLITE = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


# kill_tree reaps its children itself, so exit codes are not visible here: the tests check what
# is left and how long it took. A grandchild whose parent was killed is a zombie until init reaps
# it (up to ~2 s on this machine): it runs nothing and holds nothing, and kill_tree does not wait
# for init.
def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


def test_sigterm_ends_a_polite_tree_without_waiting_the_grace():
    proc = start(POLITE)
    t0 = time.monotonic()
    kill_tree([proc.pid], grace_s=30)
    assert time.monotonic() - t0 < 15
    assert not running(proc.pid)


def test_a_stopped_process_is_killed_at_once_not_after_the_grace():
    # A SIGSTOPped process acts on SIGTERM only after SIGCONT: waiting 30 s of grace would be waste.
    proc = start(POLITE)
    proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    kill_tree([proc.pid], grace_s=30)
    assert time.monotonic() - t0 < 15, "waited the whole grace for a frozen process"
    assert not running(proc.pid)


def test_a_tree_that_ignores_sigterm_is_killed_after_the_grace_and_nothing_is_left():
    proc = start(STUBBORN)
    procs = tree(proc)
    assert len(procs) == 2
    t0 = time.monotonic()
    kill_tree([proc.pid], grace_s=1.0)
    assert time.monotonic() - t0 >= 1.0, "SIGKILL came before the grace was over"
    assert not any(running(p.pid) for p in procs)


# A launcher like torchrun: on SIGTERM it prints a traceback; when its worker dies it starts another.
LAUNCHER = (
    "import signal, subprocess, sys, time\n"
    "def term(*a):\n"
    "    print('Traceback: SignalException got signal 15', flush=True); sys.exit(1)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('ready', worker.pid, flush=True)\n"
    "while True:\n"
    "    if worker.poll() is not None:\n"
    "        worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "        print('restarted', worker.pid, flush=True)\n"
    "    time.sleep(0.01)\n"
)


def test_a_launcher_is_ended_without_restarting_its_workers_or_printing_its_traceback():
    """`ckpt run` ends torchrun (a fatal error, a crash loop, a round end) after its own clear
    message: torchrun must neither restart the workers it sees dying nor print the traceback of
    its SIGTERM handler after that message."""
    from ckpt_tool.supervise.processes import end_launcher

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    first = launcher.stdout.readline().split()
    assert first[0] == "ready"
    end_launcher(launcher.pid, grace_s=2.0)
    assert not running(launcher.pid) and not running(int(first[1]))
    said = launcher.stdout.read()
    assert "Traceback" not in said and "restarted" not in said, said
