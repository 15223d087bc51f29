"""What the ranks of a node tell their watchdog besides beats: a crash (classified: its own
failure or a collective that failed because a peer died), a SIGTERM, a clean exit, an error a
restart cannot fix, a stop after a checkpoint, and a departure to replay from a checkpoint
(cause ``replay``: it blames nobody). The training's own events (``LOGGED``: a wrong value, a
replay's verdict) are logged by the watchdog as they come."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckpt_tool.core.node_ledger import classify_crash
from ckpt_tool.errors import RESTART_CANNOT_HELP

REPORTS = frozenset({"stopped", "exiting", "crashed", "terminated", "fatal", "replaying"})
# What the training tells that the watchdog logs as it is (with its node, round and attempt).
LOGGED = frozenset({"anomaly", "audit", "anomaly_replayed", "silent_fault"})


@dataclass
class RankReports:
    """What the node's ranks told their watchdog in one attempt, by rank pid (``take`` records it): why a
    rank died, who exited cleanly, the first error a restart cannot fix, and the step a requested or unrequested
    stop checkpointed."""

    said: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank pid -> (cause, reason) it told before dying
    exited_cleanly: set[int] = field(default_factory=set)  # ranks that said goodbye (normal exit)
    fatal: dict[str, Any] | None = None  # a rank's error that a restart cannot fix
    stopped_step: int | None = None  # the ranks stopped after a checkpoint this watchdog asked for
    stopped_unasked: int | None = None  # ... that this watchdog did not ask for (another node's, or a TERM)

    def take(self, m: dict[str, Any], stop_asked: bool) -> bool:
        """Record ``m`` (from rank pid ``m["pid"]``) when it is such a report; False for a beat."""
        event, pid = m.get("event"), m["pid"]
        if event not in REPORTS:
            return False
        if event == "stopped":
            step = m.get("step") if isinstance(m.get("step"), int) else None
            if stop_asked:  # not a rank's reaction to a teardown TERM
                self.stopped_step = step
            else:
                self.stopped_unasked = step
        elif event == "exiting":
            self.exited_cleanly.add(pid)
        elif event == "crashed":
            cause = classify_crash(str(m.get("error", "")), str(m.get("message", "")))
            self.said[pid] = (cause, f"{m.get('error', '')}: {m.get('message', '')}"[:300])
        elif event == "terminated":
            self.said.setdefault(pid, ("terminated", "SIGTERM"))
        elif event == "replaying":  # it leaves to replay from a checkpoint: nobody's failure
            self.said[pid] = (
                "replay",
                f"left to replay from checkpoint {m.get('from_step')} up to step {m.get('step')} (a wrong value there)",
            )
        else:
            code = m.get("exit_code")
            if self.fatal is None and isinstance(code, int) and code in RESTART_CANNOT_HELP:
                self.fatal = {"rank": m["rank"], "exit_code": code, "message": str(m.get("message", ""))}
        return True

    def ended_well(self, pid: int) -> bool:
        """A normal exit, a stop on request that ended well, or a departure to replay from a
        checkpoint (not a crash to report)."""
        said = self.said.get(pid)
        return said is not None and said[0] == "replay" or pid in self.exited_cleanly and (said is None or said[0] == "terminated")
