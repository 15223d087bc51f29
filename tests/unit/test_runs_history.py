"""`ckpt history`: details wrap on a terminal instead of being cut, times and durations in words in
a pipe, and --since / --event / --last to find one's way in a long run."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tool.core.history import KNOWN_EVENTS, parse_since, say, select, unknown_events
from ckpt_tool.errors import CkptError

NOW = 1_796_288_863.0022974
REASON = "rank 3 exited with SIGSEGV in the NCCL allreduce of step 1217 (a bad GPU on node gpu-17?): the last words of its log were CUDA error 700"


def ckpt_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def a_week(root: Path) -> Path:
    """A checkpoint directory whose run lasted a week: starts, commits, a failure with a long reason."""
    ckpt = root / "ckpt"
    (ckpt / "run").mkdir(parents=True)
    day = 86400.0
    run = [
        {"event": "start", "time": NOW - 7 * day, "node": "n1", "timeouts": {"step": 10.005210780000198, "checkpoint": 600.0}},
        {"event": "rank_exited", "time": NOW - 3 * day, "rank": 3, "node": "n1", "reason": REASON},
        {"event": "restarted", "time": NOW - 3 * day + 5, "attempt": 1, "seconds": 4.123456789},
        {"event": "finished", "time": NOW - 60, "exit_code": 0},
    ]
    (ckpt / "run" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in run))
    commits = [
        {"event": "commit", "time": NOW - d * day, "created_at": NOW - d * day - 1, "step": 100 * (8 - d), "probe_loss": 2.123456789}
        for d in range(7, 0, -1)
    ]
    (ckpt / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in commits))
    (ckpt / "LATEST").write_text("700\n")
    return ckpt


def test_since_takes_a_duration_or_a_local_time():
    assert parse_since("2h", NOW) == pytest.approx(NOW - 7200)
    assert parse_since("30m", NOW) == pytest.approx(NOW - 1800)
    assert parse_since("1d", NOW) == pytest.approx(NOW - 86400)
    assert parse_since("2026-12-03 10:00", NOW) == datetime.datetime(2026, 12, 3, 10, 0).timestamp()
    for bad in ("yesterday", "2x", "-1h", ""):
        with pytest.raises(CkptError) as e:
            parse_since(bad, NOW)
        assert e.value.exit_code == 2 and "2h" in e.value.hint and "2026-12-03 10:00" in e.value.hint


def test_select_filters_by_time_then_name_then_keeps_the_newest():
    timeline = [
        {"event": "commit", "time": 1.0},
        {"event": "hang", "time": 2.0},
        {"event": "commit", "time": 3.0},
        {"event": "commit", "time": 4.0},
    ]
    assert select(timeline, since=2.0) == timeline[1:]
    assert select(timeline, events=["hang"]) == [timeline[1]]
    assert select(timeline, since=2.0, events=["commit"], last=1) == [timeline[3]]
    assert select(timeline, last=10) == timeline
    assert unknown_events(["commit", "my_own", "nope"], [{"event": "my_own"}]) == ["nope"]
    assert "rank_exited" in KNOWN_EVENTS and "commit" in KNOWN_EVENTS


def test_values_in_words_times_durations_losses():
    assert say("created_at", NOW) == datetime.datetime.fromtimestamp(NOW).strftime("%Y-%m-%d %H:%M:%S")
    assert say("timeouts", {"step": 10.005210780000198}) == "step 10.005"
    assert say("seconds", 0.0001234) == "0.000123" and say("seconds", 0.0) == "0.0"
    assert say("probe_loss", 2.123456789) == "2.12346" and say("x", None) == "-" and say("ok", True) == "yes"


def test_history_in_a_pipe_has_no_epoch_floats_or_long_durations(tmp_path):
    ckpt = a_week(tmp_path)
    proc = ckpt_cli("history", ckpt, cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr
    assert "1796" not in proc.stdout and "10.00521" not in proc.stdout and "4.123456" not in proc.stdout
    created = datetime.datetime.fromtimestamp(NOW - 86400 - 1).strftime("%Y-%m-%d %H:%M:%S")
    assert f"created_at={created}" in proc.stdout and "timeouts=step 10.005, checkpoint 600.0" in proc.stdout
    assert "seconds=4.123" in proc.stdout and REASON in proc.stdout


def test_history_filters_since_event_last(tmp_path):
    ckpt = a_week(tmp_path)
    # the fixture's events are a week before NOW (in 2026); --since a date between them
    since = datetime.datetime.fromtimestamp(NOW - 3.5 * 86400).strftime("%Y-%m-%d %H:%M")
    rows = ckpt_cli("history", ckpt, "--since", since, "--json", cwd=tmp_path.parent)
    assert rows.returncode == 0, rows.stderr
    got = json.loads(rows.stdout)
    assert [e["event"] for e in got["events"]] == ["rank_exited", "commit", "restarted", "commit", "commit", "finished"]
    assert "6 of 11 events shown" in " ".join(got["notes"])
    one = json.loads(ckpt_cli("history", ckpt, "--event", "rank_exited", "--event", "restarted", "--json", cwd=tmp_path.parent).stdout)
    assert [e["event"] for e in one["events"]] == ["rank_exited", "restarted"]
    newest = ckpt_cli("history", ckpt, "--event", "commit", "--last", "2", cwd=tmp_path.parent)
    assert newest.stdout.count("\tcommit\t") == 2 and "step=700" in newest.stdout and "step=500" not in newest.stdout
    assert "2 of 11 events shown" in newest.stderr


def test_history_refuses_an_unknown_event_or_since_and_lists_what_it_takes(tmp_path):
    ckpt = a_week(tmp_path)
    bad = ckpt_cli("history", ckpt, "--event", "comit", cwd=tmp_path.parent)
    err = " ".join(bad.stderr.split())
    assert (
        bad.returncode == 2
        and "--event comit: no such event" in err
        and "known events:" in err
        and "commit, " in err
        and "rank_exited" in err
    )
    since = ckpt_cli("history", ckpt, "--since", "last tuesday", cwd=tmp_path.parent)
    assert since.returncode == 2 and "is neither a duration nor a time" in since.stderr and "30m" in since.stderr
    assert ckpt_cli("history", ckpt, "--last", "0", cwd=tmp_path.parent).returncode == 2


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a terminal")
def test_history_on_a_terminal_wraps_the_reason_instead_of_cutting_it(tmp_path):
    ckpt = a_week(tmp_path)
    command = shlex.join([sys.executable, "-m", "ckpt_tool.cli.main", "history", str(ckpt)])
    env = {**os.environ, "COLUMNS": "100", "LINES": "50", "TERM": "xterm"}
    proc = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout
    text = " ".join(proc.stdout.replace("\r", "").split())
    assert "…" not in text and "..." not in text
    for word in REASON.split():
        assert word in text  # every word of the reason is there, wrapped over lines
    assert "error 700" in text


def test_status_and_history_say_which_standby_replaced_which_node_and_why(tmp_path):
    """A job with a hot spare that replaced n2: `ckpt status` names the active nodes, the standbys
    left and who replaced whom; `ckpt history` says it in a sentence, and a failed node check with its exit."""
    run = tmp_path / "ckpt" / "run"
    run.mkdir(parents=True)
    why = "2 failures in a row (last: rank 1 exited with SIGKILL)"
    lines = [
        {"event": "nodes_active", "time": NOW - 60, "active": "n1,n2", "standby": "n3", "round": "1"},
        {
            "event": "node_check",
            "time": NOW - 50,
            "node": "n3",
            "result": "failed",
            "exit_code": 3,
            "detail": "dcgmi: PCIe error",
            "seconds": 0.4,
        },
        {
            "event": "nodes_left_behind",
            "time": NOW - 40,
            "action": "replace",
            "drop": ["n2"],
            "keep": ["n1", "n3"],
            "reason": why,
            "checkpoint": 5,
        },
        {"event": "replaced", "time": NOW - 40, "node": "n2", "by": "n3", "reason": why},
        {"event": "nodes_active", "time": NOW - 30, "active": "n1,n3", "standby": "-", "round": "2"},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    status = ckpt_cli("status", run, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "nodes: active n1,n3  standby -  left behind n2" in status.stdout, status.stdout
    assert f"replaced n2 with n3 ({why})" in status.stdout, status.stdout
    shown = json.loads(ckpt_cli("status", run, "--json", cwd=tmp_path).stdout)["health"]
    assert shown["active"] == ["n1", "n3"] and shown["replaced"] == [{"node": "n2", "by": "n3", "reason": why}]
    history = ckpt_cli("history", run, cwd=tmp_path)
    assert history.returncode == 0, history.stderr
    flat = " ".join(history.stdout.split())  # a pipe: never cut, but a long line may wrap
    assert f"replaced n2 with n3 ({why})" in flat, history.stdout
    assert "node check on n3: failed (exit 3, 0.4 s): dcgmi: PCIe error" in flat, history.stdout
