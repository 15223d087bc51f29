"""What a stop of ``ckpt run`` is for, said only as far as ``ckpt run`` knows it. Pure.

``ckpt run`` exits 75 after the stop's checkpoint whatever the signal; whether the job is then
requeued is the batch script's decision, which it records (``requeue`` with its reason, or
``cancelled`` after ``scancel``). USR1 is the time-limit warning of ``--signal`` (or a user's
``scancel --signal=USR1``): the chain requeues. A TERM may be ``scancel``, the time limit or a
preemption: the chain requeues only for the latter two, which only the batch script can tell.
"""

from __future__ import annotations

from collections.abc import Collection


def stop_purpose(signals: Collection[str], leave_node_behind: bool = False) -> tuple[str, str]:
    """(purpose, the note of ``stop_requested``) for the signals received (``USR1``, ``TERM``)."""
    if leave_node_behind:
        return "leave_node", "checkpoint at the next step, then leave the suspect node behind"
    if "TERM" in signals:
        return "stop", (
            "checkpoint at the next step, then exit 75; TERM: scancel, the time limit or a preemption "
            "(the batch script requeues only for the latter two, and notes which)"
        )
    if "USR1" in signals:
        return "requeue", "checkpoint at the next step, then exit 75 for requeue (USR1: the time-limit warning, or asked)"
    return "stop", "checkpoint at the next step, then exit 75"


def stopped_note(purpose: str) -> str:
    """The note of ``stopped_for_requeue`` (the event keeps its name: status, health and the
    benchmarks read it): a requeue is claimed only when the stop was for one."""
    if purpose == "requeue":
        return "checkpoint committed: exit 75 for requeue"
    return "checkpoint committed: exit 75; requeued or not is the batch script's decision (its requeue or cancelled event)"
