"""The account of a run's time (core/account.py) on event streams recorded from real runs
(tests/unit/data/runs/<scenario>/: a run directory's events.jsonl and the checkpoint index,
copied as the product wrote them, and about.json with the clock the recorder kept outside):
a crash (SIGKILL of a rank), a hang (SIGSTOP), a scancel, a hot-spare replacement with a
preemption, a hang on SLURM, a wrong value replayed, and the tour (preemption, a quarantined
checkpoint, a node that keeps failing, a shrink)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt_tool.core.account import KINDS, Account, account
from ckpt_tool.core.run_model import run_model

RUNS = Path(__file__).parent / "data" / "runs"
SCENARIOS = ("crash", "hang", "scancel", "replacement", "hang_slurm", "anomaly", "tour")


def recorded(name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The merged timeline of a recording (as ckpt history merges it) and its about.json."""
    d = RUNS / name
    events = [{"source": "run", **json.loads(line)} for line in (d / "events.jsonl").read_text().splitlines() if line.strip()]
    events += [{"source": "checkpoints", **json.loads(line)} for line in (d / "index.jsonl").read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: e["time"]), json.loads((d / "about.json").read_text())


def acct_of(name: str) -> tuple[Account, list[dict[str, Any]], dict[str, Any]]:
    timeline, about = recorded(name)
    a = account(timeline)
    assert a is not None
    return a, timeline, about


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_second_of_the_wall_time_is_in_exactly_one_kind(name):
    a, _, _ = acct_of(name)
    assert a.spans[0].start == a.start
    for before, after in zip(a.spans, a.spans[1:], strict=False):
        assert after.start == pytest.approx(before.end, abs=1e-9), (before, after)  # no gap, no overlap
        assert after.end >= after.start
    assert {s.kind for s in a.spans} <= set(KINDS)
    assert sum(a.totals().values()) == pytest.approx(a.wall_s)
    assert a.wall_s == pytest.approx(a.end - a.start)  # no resubmission in these: no time off
    assert 0 < a.ettr <= 1 and a.ettr_nodes <= a.ettr + 1e-9
    assert not a.running and a.final is not None
    for i in a.interruptions:  # what an interruption costs is the time charged to it
        assert sum(i.seconds.values()) == pytest.approx(sum(s.seconds for s in a.spans if s.interruption == i.index))


@pytest.mark.parametrize("name", ["crash", "hang", "scancel"])
def test_the_account_spans_the_clock_the_recorder_kept_outside(name):
    """From the first event to the last: the account misses only ckpt's own start before its first
    event and its exit after its last (measured: 0.3-0.8 s), within 2% of the wall clock."""
    a, timeline, about = acct_of(name)
    outside = about["wall_end"] - about["wall_start"]
    last = max(e["time"] for e in timeline if e["event"] != "verified")
    assert about["wall_start"] <= a.start and a.end <= about["wall_end"]
    if name != "scancel":  # a cancelled job stays in squeue after its last event (SLURM's end, not the run's)
        assert abs(a.wall_s - outside) <= 0.02 * outside, (a.wall_s, outside)
    assert a.end == pytest.approx(last, abs=1e-6)


def test_a_crash_is_seen_at_once_and_its_lost_work_is_counted_from_the_checkpoint():
    a, _, about = acct_of("crash")
    [i] = a.interruptions
    assert i.kind == "crash" and i.node == "vm" and "rank 1 killed" in i.label
    assert i.time == pytest.approx(about["fault_times"][0], abs=0.1)  # the SIGKILL, as the recorder sent it
    # killed while saving step 60 (never committed): back to 50, the 10 steps trained again
    assert (i.step, i.resumed_from, i.steps_recomputed) == (60, 50, 10)
    assert i.seconds["detection"] < 0.5 and i.seconds["recompute"] > 0.5
    assert set(i.seconds) == {"detection", "restart", "load", "recompute"}
    assert a.summary() == f"1 interruption, 10 steps recomputed, {i.down_s:.1f} s down, ETTR {a.ettr:.1%}"


def test_a_hang_starts_at_the_last_beat_not_when_it_was_found():
    """The hang event is written after the stacks: its failure is silent_s + the report's stacks_s earlier."""
    a, timeline, about = acct_of("hang")
    [i] = a.interruptions
    hang = next(e for e in timeline if e["event"] == "hang" and e["culprit"])
    assert i.kind == "hang" and "rank 0" in i.label
    assert i.time == pytest.approx(about["fault_times"][0], abs=0.3)  # the SIGSTOP
    assert hang["time"] - i.time > hang["silent_s"]  # found later: the stacks took their time
    assert hang["timeout_s"] <= i.seconds["detection"] <= hang["timeout_s"] + 3
    assert (i.step, i.resumed_from, i.steps_recomputed) == (55, 50, 5)
    assert a.dominant()[0] == "detection"


def test_a_hang_on_slurm_names_its_node():
    a, _, about = acct_of("hang_slurm")
    [i] = a.interruptions
    assert i.kind == "hang" and i.node == "n2" and i.step == 39 and i.resumed_from == 30 and i.steps_recomputed == 9
    assert i.time == pytest.approx(about["fault_times"][0], abs=0.5)
    assert a.final == "job_finished"


def test_scancel_ends_the_account_after_the_stops_checkpoint():
    a, timeline, about = acct_of("scancel")
    [i] = a.interruptions
    assert i.kind == "cancelled" and i.time == pytest.approx(about["fault_times"][0], abs=0.2)
    assert i.seconds == {"checkpoint": pytest.approx(i.seconds["checkpoint"])} and i.seconds["checkpoint"] > 0
    stop = next(e for e in timeline if e["event"] == "stopped_for_requeue")
    assert a.final == "cancelled" and a.end == pytest.approx(stop["time"])
    assert i.steps_recomputed == 0 and i.down_s == i.seconds["checkpoint"]


def test_a_replacement_keeps_the_size_and_a_preemption_waits_in_the_queue():
    a, _, _ = acct_of("replacement")
    kinds = [i.kind for i in a.interruptions]
    assert kinds == ["crash", "crash", "preemption"]
    second, preempted = a.interruptions[1], a.interruptions[2]
    assert second.node == "n2" and "n2 replaced by n3" in second.then
    assert preempted.then == ("requeued",) and preempted.seconds["queue"] > 1 and preempted.seconds["checkpoint"] > 0
    assert preempted.resumed_from == preempted.step and preempted.steps_recomputed == 0  # the stop's checkpoint: nothing lost
    lanes = a.lanes
    assert lanes["n2"][-1][2] == "left behind" and lanes["n3"][0][2] == "standby" and lanes["n3"][-1][2] == "active"
    assert a.nodes_full == 2 and a.node_seconds_lost < 0.01  # the standby took the slot at once
    assert "node-h" not in a.summary()


def test_a_wrong_value_replayed_is_an_interruption():
    a, _, _ = acct_of("anomaly")
    [i] = a.interruptions
    assert i.kind == "wrong value" and "rank 1" in i.label and "nan" in i.label
    assert (i.step, i.resumed_from, i.steps_recomputed) == (12, 10, 2)


def test_the_tour_a_preemption_a_quarantine_two_crashes_and_a_shrink():
    a, _, _ = acct_of("tour")
    p, c1, c2 = a.interruptions
    assert (p.kind, c1.kind, c2.kind) == ("preemption", "crash", "crash")
    assert p.then == ("requeued", "step 14 quarantined", "rolled back to step 10") and p.step == 14
    # 11-13 trained after the requeue, again after the first crash, 11-14 after the shrink: 10 steps twice
    assert [i.steps_recomputed for i in a.interruptions] == [3, 3, 4] and a.steps_recomputed == 10
    assert c2.then == ("n3 left behind (shrink)",) and c2.node == "n3"
    assert a.nodes_full == 3 and a.lanes["n3"][-1][2] == "left behind" and a.lanes["n1"][-1][2] == "active"
    assert a.node_seconds_lost > 5 and a.ettr_nodes < a.ettr
    assert "of the node-hours" in a.summary() and a.summary().startswith("3 interruptions, 10 steps recomputed, ")


def test_a_window_keeps_the_spans_and_interruptions_inside_it():
    a, _, _ = acct_of("tour")
    lo, hi = a.interruptions[1].time - 1, a.interruptions[2].time + 1
    w = a.window(lo, hi)
    assert w.start == lo and w.end == hi and w.wall_s == pytest.approx(hi - lo)
    assert [i.index for i in w.interruptions] == [1, 2]
    assert all(lo <= s.start and s.end <= hi for s in w.spans)


def _stream(*events: tuple[float, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"time": t, "event": name, **fields} for t, name, fields in events]


def test_time_between_a_cancel_and_a_resubmission_is_not_wall_time():
    run = {"round": "r1", "attempt": 0, "node": "n1"}
    again = {"round": "r2", "attempt": 0, "node": "n1"}
    timeline = _stream(
        (0.0, "job_start", {"job_id": "1"}),
        (5.0, "ranks_started", run),
        (105.0, "commit", {"step": 100, "created_at": 105.0}),
        (110.0, "cancelled", {"cause": "scancel"}),  # the batch script's TERM: the ranks stop after a checkpoint
        (110.5, "stop_requested", {**run, "purpose": "stop", "signals": ["TERM"]}),
        (111.0, "stopped_for_requeue", {**run, "step": 106}),  # its checkpoint did not commit (say the disk was full)
        (1000.0, "job_start", {"job_id": "2"}),  # resubmitted the next morning
        (1005.0, "ranks_started", again),
        (1010.0, "resumed", {**again, "checkpoint": 100}),
        (1110.0, "commit", {"step": 200, "created_at": 1110.0}),
        (1111.0, "job_finished", {}),
    )
    a = account(timeline)
    assert a.off_s == pytest.approx(889.0) and a.wall_s == pytest.approx(1111.0 - 889.0)
    [i] = a.interruptions
    assert i.kind == "cancelled" and i.step == 106 and i.resumed_from == 100 and i.steps_recomputed == 6
    assert i.seconds == {
        "checkpoint": pytest.approx(1.0),  # the stop's
        "restart": pytest.approx(5.0),  # the new job's start to its first beat
        "load": pytest.approx(5.0),
        "recompute": pytest.approx(6.0),  # steps 101-106 again, at 1 s a step
    }
    assert a.final == "job_finished" and not a.running


def test_a_running_job_is_accounted_up_to_now():
    timeline = _stream((0.0, "job_start", {}), (5.0, "ranks_started", {"round": "r", "attempt": 0}))
    a = account(timeline, now=65.0)
    assert a.running and a.end == 65.0 and a.totals()["productive"] == pytest.approx(60.0)
    assert a.summary().endswith("ETTR 92.3% so far")
    assert account([{"time": 1.0, "event": "commit", "step": 5}]) is None  # no job ever started: nothing to account


def test_the_run_against_the_model_names_the_largest_cost_and_what_moves_it():
    run = {"round": "r", "attempt": 0, "node": "n1"}
    after = {"round": "r", "attempt": 1, "node": "n1"}
    timeline = _stream(
        (0.0, "start", run),
        (2.0, "ranks_started", run),
        *[(2.0 + 60 * k, "commit", {"step": 60 * k, "created_at": 2.0 + 60 * k, "blocked_s": 2.0, "run_id": "x"}) for k in range(1, 6)],
        (330.0, "hang", {**run, "rank": 1, "culprit": True, "silent_s": 600.0, "step": 328}),
        (331.0, "killed_ranks", run),
        (340.0, "restarted", after),
        (341.0, "ranks_started", after),
        (343.0, "resumed", {**after, "checkpoint": 300}),
        (400.0, "commit", {"step": 357, "created_at": 400.0, "blocked_s": 2.0, "run_id": "x"}),
        (401.0, "finished", after),
    )
    a = account(timeline)
    assert a.dominant()[0] == "detection"  # 600 s of silence before the hang was found
    m = run_model(a, timeline)
    assert m.checkpoint_s == 2.0 and m.interval_s == pytest.approx(58.0) and m.interruptions == 1
    assert m.predicted is not None and m.best_interval_s is not None
    assert "--timeout step=SECONDS" in m.advice[0] or "--timeout step=SECONDS" in m.advice[1]
    assert m.to_json()["dominant"][0] == "detection"


def ckpt_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def as_checkpoint_dir(name: str, root: Path) -> Path:
    """A checkpoint directory holding a recording's index and run/events.jsonl."""
    ckpt = root / name
    (ckpt / "run").mkdir(parents=True)
    shutil.copy(RUNS / name / "events.jsonl", ckpt / "run" / "events.jsonl")
    shutil.copy(RUNS / name / "index.jsonl", ckpt / "index.jsonl")
    return ckpt


def test_history_and_status_open_with_the_account(tmp_path):
    ckpt = as_checkpoint_dir("tour", tmp_path)
    a, _, _ = acct_of("tour")
    shown = ckpt_cli("history", ckpt, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == a.summary()
    assert "of wall time: training" in lines[1] and "recomputing lost steps" in lines[1]
    assert "preemption (USR1)" in shown.stdout and "n3 left behind (shrink)" in shown.stdout
    data = json.loads(ckpt_cli("history", ckpt, "--json", cwd=tmp_path).stdout)
    assert data["account"]["steps_recomputed"] == 10 and data["account"]["summary"] == a.summary()
    assert [i["kind"] for i in data["account"]["interruptions"]] == ["preemption", "crash", "crash"]
    status = ckpt_cli("status", ckpt, cwd=tmp_path)
    assert status.returncode == 0 and status.stdout.splitlines()[0] == a.summary(), status.stdout


def test_history_until_and_since_bound_the_events_and_the_account(tmp_path):
    ckpt = as_checkpoint_dir("tour", tmp_path)
    a, _, _ = acct_of("tour")
    import datetime

    def local(t: float) -> str:
        return datetime.datetime.fromtimestamp(t).isoformat(sep=" ")

    lo, hi = a.interruptions[1].time - 0.5, a.interruptions[2].time + 0.5
    data = json.loads(ckpt_cli("history", ckpt, "--since", local(lo), "--until", local(hi), "--json", cwd=tmp_path).stdout)
    assert all(lo <= e["time"] <= hi for e in data["events"]) and data["events"]
    assert [i["index"] for i in data["account"]["interruptions"]] == [1, 2]
    assert data["account"]["wall_s"] == pytest.approx(hi - lo, abs=0.01)
    assert any("between --since and --until" in n for n in data["notes"])
    bad = ckpt_cli("history", ckpt, "--until", "soon", cwd=tmp_path)
    assert bad.returncode == 2 and "--until 'soon' is neither a duration nor a time" in bad.stderr
    backwards = ckpt_cli("history", ckpt, "--since", "1h", "--until", "2h", cwd=tmp_path)
    assert (
        backwards.returncode == 2
        and "--until '2h' is before --since '1h'" in backwards.stderr
        and "--since 2h --until 1h" in backwards.stderr
    )


def test_plan_run_dir_compares_the_run_with_the_model(tmp_path):
    ckpt = as_checkpoint_dir("hang", tmp_path)
    shown = ckpt_cli("plan", "--run-dir", ckpt, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "measured ETTR" in shown.stdout and "the largest cost: detection" in shown.stdout
    assert "--timeout step=SECONDS" in shown.stdout
    assert "save cost not recorded" in shown.stdout  # recorded before commits carried blocked_s: said, not guessed
    empty = tmp_path / "empty"
    (empty / "run").mkdir(parents=True)
    mixed = ckpt_cli("plan", "--run-dir", ckpt, "--restart-seconds", "5", cwd=tmp_path)
    assert (
        mixed.returncode == 2 and "missing option --ckpt-seconds" in mixed.stderr and f"ckpt plan --run-dir {ckpt}` alone" in mixed.stderr
    )
    refused = ckpt_cli("plan", "--run-dir", empty, cwd=tmp_path)
    assert refused.returncode == 3 and "holds no run to compare" in refused.stderr and "ckpt plan --ckpt-seconds" in refused.stderr
