"""The run directory's files through their one reader/writer (``supervise.run_dir``): each
written with its version and read back; a file from before versions reads as version 1; one
from a newer ckpt-tool is a clear ``NewerFormatError`` (or skipped, for the best-effort files),
never a KeyError; the event log refuses names outside the catalog and keeps unknown fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tool.core.timeouts import DurationLog
from ckpt_tool.errors import CkptError, ExitCode, NewerFormatError
from ckpt_tool.supervise import round_end, run_dir
from ckpt_tool.supervise.rank_vitals import read_rank_health


def test_each_json_file_is_written_with_its_version_and_read_back(tmp_path):
    log = DurationLog()
    log.add("step", 0.5)
    run_dir.write_timeouts(tmp_path, log, {"step": 30.0})
    round_end.end_round(tmp_path, "7.0.0", ["n2"], "n1", checkpoint_first=True)
    run_dir.write_health(tmp_path, {"nodes": [], "suspects": ["n2"]})
    run_dir.write_ranks(tmp_path, "n1", 2, {1: 101, 0: 100})
    for name in ("timeouts.json", "round_end.json", "health.json", "ranks.n1.json"):
        assert json.loads((tmp_path / name).read_text())["version"] == 1, name
    assert run_dir.read_timeouts(tmp_path).to_json() == log.to_json()
    assert round_end.round_ended(tmp_path, "7.0.0") == round_end.RoundEnd(["n2"], True)
    assert round_end.round_ended(tmp_path, "7.1.0") is None  # another round's marker
    assert run_dir.read_health(tmp_path)["suspects"] == ["n2"]
    assert run_dir.read_ranks(tmp_path) == {0: 100, 1: 101}
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp file left"


def test_a_file_written_before_versions_reads_as_version_1(tmp_path):
    """As ckpt-tool wrote them until now: no version field."""
    (tmp_path / "timeouts.json").write_text(json.dumps({"durations": {"step": [0.5, 0.6]}, "timeouts": {"step": 5.0}}))
    (tmp_path / "round_end.json").write_text(json.dumps({"round": "r", "suspects": ["n1"], "by": "n2", "checkpoint_first": False}))
    (tmp_path / "ranks.n1.json").write_text(json.dumps({"node": "n1", "attempt": 0, "ranks": {"0": 42}}))
    assert run_dir.read_timeouts(tmp_path).to_json() == {"step": [0.5, 0.6]}
    assert round_end.round_ended(tmp_path, "r") == round_end.RoundEnd(["n1"], False)
    assert run_dir.read_ranks(tmp_path) == {0: 42}


@pytest.mark.parametrize("name", ["timeouts.json", "round_end.json", "health.json"])
def test_a_newer_file_is_a_clear_newer_format_error_not_a_key_error(tmp_path, name):
    # a newer ckpt-tool renamed every field: an old reader must not trip over a missing one
    (tmp_path / name).write_text(json.dumps({"version": 2, "renamed": {}}))
    read = {"timeouts.json": run_dir.read_timeouts, "round_end.json": run_dir.read_round_end, "health.json": run_dir.read_health}[name]
    with pytest.raises(NewerFormatError) as exc:
        read(tmp_path)
    assert exc.value.exit_code == ExitCode.CONFLICT
    assert str(tmp_path / name) in exc.value.message and "version 2" in exc.value.message and "up to version 1" in exc.value.message
    assert "pip install -U ckpt-tool" in exc.value.hint


def test_the_best_effort_files_skip_a_newer_or_torn_node_and_keep_the_others(tmp_path):
    row = {"rank": 0, "step": 5, "wall_s": 1.0, "compute_s": 0.9, "wait_s": 0.1, "score": 1.0, "individual": 1.0}
    run_dir.write_rank_health(tmp_path, "n1", {"node": "n1", "time": 5.0, "ranks": [row]})
    (tmp_path / "rank_health.n2.json").write_text(json.dumps({"version": 9, "node": "n2", "time": 5.0, "ranks": [{**row, "rank": 1}]}))
    (tmp_path / "rank_health.n3.json").write_text('{"node": "n3", "ti')  # torn by hand
    run_dir.write_ranks(tmp_path, "n1", 0, {0: 10})
    (tmp_path / "ranks.n2.json").write_text(json.dumps({"version": 9, "ranks": {"1": 11}}))
    assert read_rank_health(tmp_path) == [{**row, "node": "n1", "as_of": 5.0}]
    assert run_dir.read_ranks(tmp_path) == {0: 10}


def test_a_file_that_is_not_an_object_or_has_a_bad_version_is_said_as_such(tmp_path):
    (tmp_path / "timeouts.json").write_text("[1, 2]")
    assert run_dir.read_timeouts(tmp_path) is None  # not what a writer writes: as if absent
    (tmp_path / "timeouts.json").write_text(json.dumps({"version": "two"}))
    with pytest.raises(CkptError, match="version 'two', not a number"):
        run_dir.read_timeouts(tmp_path)


def test_note_refuses_a_name_outside_the_catalog_and_writes_nothing(tmp_path):
    with pytest.raises(CkptError) as exc:
        run_dir.note(tmp_path / "run", "job_strat", job_id=1)
    assert exc.value.exit_code == ExitCode.USAGE and "'job_strat'" in exc.value.message and "user.NAME" in exc.value.hint
    assert not (tmp_path / "run").exists()


def test_events_keep_unknown_fields_and_skip_torn_lines(tmp_path):
    run_dir.note(tmp_path, "user.lr_drop", lr=0.1)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "hang", "time": 2.0, "rank": 1, "added_in_v9": {"x": 1}}) + "\n")
        f.write('{"event": "rank_ex')  # torn by a crash mid-append
    run_dir.note(tmp_path, "restarted", node="n1")
    events, skipped = run_dir.load_events(tmp_path)
    assert [e["event"] for e in events] == ["user.lr_drop", "hang", "restarted"]
    assert events[1]["added_in_v9"] == {"x": 1} and events[0]["lr"] == 0.1
    assert skipped == (3,)


def _ckpt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("ckpt")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=60)


def test_ckpt_note_refuses_a_typo_and_takes_a_user_event(tmp_path):
    run = tmp_path / "run"
    refused = _ckpt("note", str(run), "job_finishd", cwd=tmp_path)
    assert refused.returncode == ExitCode.USAGE, refused.stderr
    assert "'job_finishd' is not an event ckpt-tool knows" in refused.stderr and "user.NAME" in refused.stderr
    assert not run.exists()
    taken = _ckpt("note", str(run), "user.eval_done", "score=0.9", cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr
    [event] = run_dir.read_events(run)
    assert event["event"] == "user.eval_done" and event["score"] == "0.9"
    shown = _ckpt("history", str(run), "--event", "user.eval_done", cwd=tmp_path)
    assert shown.returncode == 0 and "user.eval_done" in shown.stdout and "score=0.9" in shown.stdout, shown.stderr


def test_ckpt_status_shows_the_newest_final_event_as_the_jobs_final_state(tmp_path):
    run = tmp_path / "run"
    run_dir.note(run, "resumed", node="n1", round="r", attempt=0, rank=0, step=5, checkpoint=5)  # no job id: scontrol is not asked
    run_dir.note(run, "cancelled", cause="scancel", requeued="no", restarts="0")
    run_dir.note(run, "user.after", x="1")  # not a final state: the cancel stays the job's
    shown = _ckpt("status", str(run), "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["final"] == "cancelled"
    text = _ckpt("status", str(run), cwd=tmp_path)
    assert "final state: cancelled" in text.stdout, text.stdout


def test_the_newest_rounds_ranks_leave_out_a_node_left_behind_and_probes_are_per_round(tmp_path):
    run_dir.write_ranks(tmp_path, "n2", 0, {1: 201}, "7.0.0", "n2:4000")  # n2, left behind after round 7.0.0
    run_dir.write_ranks(tmp_path, "n1", 0, {0: 100}, "7.0.1", "n1:4001")
    run_dir.write_ranks(tmp_path, "n3", 0, {1: 301}, "7.0.1", "n3:4002")
    assert run_dir.read_ranks(tmp_path, newest_round=True) == {0: 100, 1: 301}
    assert run_dir.read_probes(tmp_path, "7.0.1") == {"n1": "n1:4001", "n3": "n3:4002"}
    assert run_dir.read_probes(tmp_path, "7.0.0") == {"n2": "n2:4000"}


def test_events_are_read_after_an_offset_and_a_half_written_line_waits(tmp_path):
    """ckpt job polls the log while a round starts: only what is new, never a line cut in half."""
    run_dir.note(tmp_path, "start", node="n1", round="1.0.0")
    at = run_dir.events_size(tmp_path)
    assert run_dir.read_events_after(tmp_path, at) == ([], at)
    run_dir.note(tmp_path, "start", node="n2", round="1.0.0")
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"event": "start", "node": "n3"')  # its writer is still at it
    new, at2 = run_dir.read_events_after(tmp_path, at)
    assert [(e["event"], e["node"]) for e in new] == [("start", "n2")]
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write(', "round": "1.0.0"}\ngarbage\n')
    new, at3 = run_dir.read_events_after(tmp_path, at2)
    assert [e["node"] for e in new] == ["n3"] and at3 == run_dir.events_size(tmp_path)
    assert run_dir.read_events_after(tmp_path / "absent", 0) == ([], 0)
    assert run_dir.events_size(tmp_path / "absent") == 0
