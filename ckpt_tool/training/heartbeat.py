"""Rank-side heartbeats: tell the ``ckpt run`` supervisor which step and phase this rank is in.

    from ckpt_tool.training.heartbeat import heartbeat
    hb = heartbeat()                 # a no-op outside `ckpt run`
    with hb.phase("data"):
        batch = next(loader)
    hb.beat(step)                    # CheckpointManager.maybe_save() does this for you

Phases: ``init``, ``step``, ``data``, ``checkpoint``, ``eval``; each has its own hang timeout, so a
long checkpoint write or a data stall is not mistaken for a hang. The manager marks ``init``
(resume) and ``checkpoint`` (save) itself. ``stop_requested()`` is true once the supervisor
asked this rank to checkpoint and stop (SIGUSR1/SIGTERM to ``ckpt run``).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckpt_tool.core.handoff import WARM_MARKER
from ckpt_tool.core.node_ledger import classify_crash
from ckpt_tool.supervise import channel, stacks
from ckpt_tool.training.step_timing import StepTimer


class Heartbeat:
    """One rank's line to the ``ckpt run`` supervisor (its socket path: ``supervisor``; None outside
    ``ckpt run``, where every call is a no-op). Holds the rank's step, phase, newest committed checkpoint and
    step timer, sends them on each beat, and reports an uncaught exception before the rank dies. Use
    ``heartbeat()`` for the process's one instance."""

    def __init__(self, supervisor: str | None) -> None:
        self.supervisor = supervisor
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.step = 0
        self.current = "init"
        self.ckpt: int | None = None
        self.resumed_from: int | None = None  # the checkpoint this attempt resumed from
        self._stop = False
        self._fatal_sent = False
        self.warm = os.environ.get(WARM_MARKER) == "1"  # a pre-warmed spare took this rank over
        self._sock: socket.socket | None = None
        self._addr: Path | None = None
        self.timer = StepTimer()  # per-step timings for the straggler scores (fed by the manager's step sync)
        if supervisor:
            directory = Path(supervisor).parent if Path(supervisor).parent.is_dir() else Path(tempfile.gettempdir())
            self._addr = directory / f"rank{self.rank}-{os.getpid()}.sock"
            self._sock = channel.bind(self._addr)
            stacks.arm(self.rank)  # the watchdog can ask for this rank's stacks, even when it is blocked in C
            atexit.register(self._goodbye)
            self._previous_hook = sys.excepthook
            sys.excepthook = self._on_uncaught

    @property
    def active(self) -> bool:
        """Whether a supervisor listens (the rank runs under ``ckpt run``)."""
        return self._sock is not None

    def beat(self, step: int | None = None, phase: str | None = None) -> None:
        """Tell the supervisor this rank is alive at ``step`` in ``phase`` (each kept for later beats when
        given), with the last finished step's timings. Best effort: a no-op when not active; never
        blocks."""
        if step is not None:
            self.step = step
        if phase is not None:
            self.current = phase
        if self._sock is None:
            return
        message = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world": self.world,
            "pid": os.getpid(),
            "step": self.step,
            "phase": self.current,
            "attempt": self.attempt,
            "ckpt": self.ckpt,
            "resumed_from": self.resumed_from,
            "addr": str(self._addr),
            "warm": self.warm,
        }
        timing = self.timer.take()
        if timing is not None:  # the last finished step's timings ride on the next beat
            message["timing"] = timing.to_wire()
        channel.send(self._sock, self.supervisor, message)

    def send_event(self, event: str, **data: object) -> None:
        """Send one event (``fatal``, ``crashed``, ``terminated``...) with ``data`` to the supervisor; a
        no-op when not active."""
        if self._sock is not None:
            channel.send(self._sock, self.supervisor, {"rank": self.rank, "pid": os.getpid(), "event": event, **data})

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark the block as phase ``name`` (``data``, ``eval``, ``checkpoint``...): a beat on entry, its
        time kept apart from the step's compute, and a beat back in the previous phase on exit,
        exceptions included."""
        previous = self.current
        self.beat(phase=name)
        self.timer.enter(name)
        try:
            yield
        finally:
            self.timer.leave(name)
            self.beat(phase=previous if previous != "init" else "step")

    def checkpoint_committed(self, step: int) -> None:
        """Record that checkpoint ``step`` is committed: later beats carry it, so the supervisor knows what
        a restart resumes from."""
        self.ckpt = step

    def resumed(self, step: int) -> None:
        """This attempt continues from checkpoint ``step`` (not a fresh start)."""
        self.resumed_from = self.ckpt = step

    def fatal(self, exit_code: int, message: str) -> None:
        """Tell the supervisor this rank stops on an error a restart cannot fix (bad arguments,
        a checkpoint that does not fit): ``ckpt run`` then stops the job at once with
        ``exit_code`` and this message instead of restarting it into the same error."""
        if not self._fatal_sent:
            self._fatal_sent = True
            self.send_event("fatal", exit_code=int(exit_code), message=message[:2000])

    def terminated(self) -> None:
        """This rank got SIGTERM: when it now dies, it was stopped (torchrun tearing the group
        down after another rank failed, or a preemption), not a failure of its own."""
        self.send_event("terminated", time=time.time())

    def _on_uncaught(self, kind: type[BaseException], value: BaseException, tb: object) -> None:
        """An exception ends this rank: tell the supervisor what it was, so that it can tell a
        failure of this node from a collective that failed because a peer died. A peer's death
        is said in one line instead of the traceback (the traceback would only show where this
        rank waited: the cause is the peer's, and ``ckpt run`` logs it); any other exception
        prints its traceback as ever."""
        if not issubclass(kind, KeyboardInterrupt):
            error = f"{kind.__module__}.{kind.__qualname__}"
            self.send_event("crashed", error=error, message=str(value)[:500], time=time.time())
            if classify_crash(error, str(value)) == "peer_failure":
                print(peer_died_line(self.rank, self.step, kind, value), file=sys.stderr, flush=True)
                return
        self._previous_hook(kind, value, tb)  # type: ignore[arg-type]

    def request_stop(self) -> None:
        """Ask this rank to save and stop at its next step (what the SIGTERM handler does under ``ckpt run``)."""
        self._stop = True

    def stop_requested(self) -> bool:
        """Whether this rank was asked to save and stop: by ``request_stop`` or by the supervisor's
        ``save_and_stop`` command (read without waiting). Stays True once set."""
        if self._sock is not None and not self._stop:
            self._stop = any(m.get("cmd") == "save_and_stop" for m in channel.receive_all(self._sock))
        return self._stop

    def _goodbye(self) -> None:
        """At interpreter exit: tell the supervisor this exit is not a crash to report."""
        self.send_event("exiting")
        self.close()

    def close(self) -> None:
        """Close the socket and remove its file; later calls are no-ops, as are beats after it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            if self._addr is not None:
                self._addr.unlink(missing_ok=True)


_instance: Heartbeat | None = None


def heartbeat() -> Heartbeat:
    """The process's heartbeat: connected to the ``ckpt run`` supervisor when it set
    ``CKPT_HEARTBEAT_SOCKET``, a no-op otherwise (one per torchrun attempt).

    Use ``beat(step, phase)``, ``with phase("data"):`` around a data loader (a slow batch is not a
    hang), ``stop_requested()`` (the supervisor asked for a checkpoint and a stop), and
    ``fatal(exit_code, message)`` before exiting on an error a restart cannot fix. Never raises:
    a vanished supervisor makes every call a no-op.
    """
    global _instance
    if _instance is None or _instance.attempt != int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
        _instance = Heartbeat(os.environ.get(channel.ENV_SOCKET))
    return _instance


def peer_died_line(rank: int, step: int, kind: type[BaseException], value: BaseException) -> str:
    """What a rank whose collective failed because a peer died says instead of its traceback."""
    detail = (str(value).strip().splitlines() or [""])[0][:200]
    return f"rank {rank}: a peer rank died at step {step} (its collective failed: {kind.__name__}: {detail}); exiting: ckpt run decides the restart"
