"""Running the ``--notify`` command: ``sh -c CMD`` with an event's JSON on stdin, bounded, never fatal.

``ckpt job`` hands each event the chain tells (``chain.Notify``) to a ``Notifier``: one thread
runs the commands one after the other, in the order of the events, so the chain never waits on
a webhook. Each command runs in its own session (its whole pipeline is killed at the timeout)
with SIGTERM and SIGUSR1 blocked (inherited through exec: the TERM that ``scancel`` sends to
every process of the job does not cut the notification of that very cancellation; SIGKILL
after KillWait still ends it). A command that fails, hangs or cannot start is recorded as a
``notify_failed`` event in ``RUN_DIR/events.jsonl`` and a line of the job's output; the chain
goes on. Before ``ckpt job`` exits it waits for the notifications still queued (``close``).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tool.core.notify import ENV_NAMES, NOTIFY_FAILED_EVENT, JobContext, NotifyConfig, failure_detail, payload
from ckpt_tool.supervise.run_dir import note

KILL_WAIT_S = 5.0  # after the kill at the timeout, how long to wait for the output pipe to close


@dataclass(frozen=True)
class NotifyResult:
    """One run of the command: its exit status (None: killed at the timeout; 127: could not start), its
    output (stdout and stderr together) and how long it took."""

    exit_code: int | None
    output: str
    seconds: float


def run_command(command: str, data: Mapping[str, Any], timeout_s: float, env: Mapping[str, str] | None = None) -> NotifyResult:
    """``sh -c command`` with ``data`` as one JSON line on stdin, output captured; its process group
    is killed (SIGKILL) after ``timeout_s``. Never raises for the command's own failure."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ if env is None else env),
            start_new_session=True,
        )
    except OSError as exc:
        return NotifyResult(127, f"cannot start /bin/sh: {exc.strerror or exc}", time.monotonic() - started)
    line = (json.dumps(data, sort_keys=True, default=str) + "\n").encode()
    try:
        output, _ = proc.communicate(line, timeout=timeout_s)
        code: int | None = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        try:
            output, _ = proc.communicate(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # a child that left the group still holds the pipe: give up on it
            for pipe in (proc.stdout, proc.stdin):
                if pipe is not None:
                    pipe.close()
            proc.wait()
            output = b""
        code = None
    return NotifyResult(code, (output or b"").decode(errors="replace"), time.monotonic() - started)


class Notifier:
    """The ``--notify`` command of one start of the job: ``send`` queues an event (the payload is
    built at once, with the time of the event), a thread runs the command for each, ``close``
    waits for them. ``context`` says where the job is now; ``log`` writes a line of the job's output."""

    def __init__(
        self,
        config: NotifyConfig,
        run_dir: Path,
        context: Callable[[], JobContext],
        log: Callable[[str], None],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.context = context
        self.log = log
        base = dict(os.environ if env is None else env)
        self.env = {k: v for k, v in base.items() if k not in ENV_NAMES}  # the command needs not see itself
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def send(self, event: str, fields: Mapping[str, str]) -> bool:
        """Queue ``event`` when the command is run for it; returns whether it was queued."""
        if not self.config.wants(event):
            return False
        self._queue.put(payload(event, fields, self.context(), time.time()))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="ckpt-notify", daemon=True)
            self._thread.start()
        return True

    def close(self) -> None:
        """Wait for the queued notifications (each bounded by the timeout), then stop the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()

    def _work(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})  # inherited by the commands
        while True:
            data = self._queue.get()
            if data is None:
                return
            try:
                self._notify(data)
            except Exception as exc:  # noqa: BLE001 - a notification never ends the job
                self.log(f"notify {data.get('event')}: {type(exc).__name__}: {exc}")

    def _notify(self, data: dict[str, Any]) -> None:
        event = str(data["event"])
        env = {**self.env, "CKPT_NOTIFY_EVENT": event, "CKPT_NOTIFY_MESSAGE": str(data["message"])}
        result = run_command(self.config.command, data, self.config.timeout_s, env)
        detail = failure_detail(result.exit_code, result.output, self.config.timeout_s)
        if detail is None:
            self.log(f"notified {event} ({result.seconds:.1f} s)")
            return
        self.log(f"notify {event} failed: {detail}; the job goes on (the command: --notify)")
        try:
            note(
                self.run_dir,
                NOTIFY_FAILED_EVENT,
                for_event=event,
                exit_code=result.exit_code,
                detail=detail,
                seconds=round(result.seconds, 3),
            )
        except OSError as exc:
            self.log(f"cannot write the event {NOTIFY_FAILED_EVENT} to {self.run_dir}: {exc.strerror or exc}")
