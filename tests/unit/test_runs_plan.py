"""`ckpt plan`: the step time the ranks measured (not the phase-span fragments of timeouts.json),
said where it came from; a checkpoint directory accepted; no optimum marked when no interval works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tool.core.interval import measured_step_time, plan_interval

STEP = 0.66


def ckpt_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def rank_row(rank: int, wall: float) -> dict:
    return {"rank": rank, "step": 400, "wall_s": wall, "compute_s": wall * 0.9, "wait_s": wall * 0.1, "score": 1.0, "individual": 1.0}


def a_run(root: Path, ranks: bool = True, commits: bool = True) -> Path:
    """A checkpoint directory as `ckpt run` leaves it after 0.66 s steps: timeouts.json whose step
    spans are half 2-20 ms fragments at phase switches, the ranks' step timings, commits every 50 steps."""
    ckpt = root / "ckpt"
    run = ckpt / "run"
    run.mkdir(parents=True)
    spans = [0.002 + 0.018 * i / 99 for i in range(100)] + [STEP] * 100
    (run / "timeouts.json").write_text(json.dumps({"durations": {"step": spans}, "timeouts": {"step": 5.0}}))
    if ranks:
        table = {"node": "n1", "time": 1.0, "attempt": 0, "ranks": [rank_row(0, STEP), rank_row(1, STEP + 0.01)]}
        (run / "rank_health.n1.json").write_text(json.dumps(table))
    if commits:
        lines = [
            {"event": "commit", "time": 1000 + 50 * STEP * i + 2, "created_at": 1000 + (50 * STEP + 2) * i, "step": 50 * i, "run_id": "r"}
            for i in range(1, 6)
        ]
        (ckpt / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        (ckpt / "LATEST").write_text("250\n")
    return ckpt


def test_the_ranks_step_timings_come_first_then_the_commit_spacing():
    rows = [rank_row(0, 0.6), rank_row(1, 0.7), rank_row(2, 0.65)]
    commits = [{"created_at": 100.0 + 12 * i, "step": 10 * i, "run_id": "a"} for i in range(4)]
    found = measured_step_time(rows, commits, 2.0)
    assert found is not None and found.seconds == pytest.approx(0.65) and found.source == "rank step timings"
    spaced = measured_step_time([], commits, 2.0)  # 12 s per 10 steps, 2 s of which the checkpoint
    assert spaced is not None and spaced.seconds == pytest.approx(1.0) and spaced.source == "commit spacing"
    assert "3 gap(s)" in spaced.detail and "less 2 s of checkpoint" in spaced.detail


def test_commit_spacing_skips_gaps_across_runs_and_steps_that_go_back():
    commits = [
        {"created_at": 0.0, "step": 10, "run_id": "a"},
        {"created_at": 10.0, "step": 20, "run_id": "a"},  # 1 s/step
        {"created_at": 500.0, "step": 20, "run_id": "b"},  # a new run resumed from 20: not a gap
        {"created_at": 510.0, "step": 30, "run_id": "b"},  # 1 s/step
        {"created_at": 520.0, "step": 25, "run_id": "b"},  # after a rollback: not a gap
        {"created_at": "x", "step": 40},  # not a commit of anyone's
    ]
    found = measured_step_time([], commits)
    assert found is not None and found.seconds == pytest.approx(1.0) and "2 gap(s)" in found.detail
    assert measured_step_time([], commits[:1]) is None
    assert measured_step_time([{"wall_s": "slow"}], []) is None


def test_plan_uses_the_ranks_step_time_and_says_so(tmp_path):
    ckpt = a_run(tmp_path)
    for target in (ckpt / "run", ckpt):  # the run directory, or the checkpoint directory as status/history take
        proc = ckpt_cli("plan", "--ckpt-seconds", "2", "--mtbf-hours", "10", "--run-dir", target, "--json", cwd=tmp_path.parent)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["step_seconds"] == pytest.approx(STEP + 0.005) and got["step_seconds_source"] == "rank step timings"
        assert got["interval_steps"] == plan_interval(2, 36000, step_s=STEP + 0.005).interval_steps
    text = ckpt_cli("plan", "--ckpt-seconds", "2", "--mtbf-hours", "10", "--run-dir", ckpt, cwd=tmp_path.parent)
    assert "step time 0.665 s, from the rank step timings" in text.stdout and "rank_health" in text.stdout


def test_plan_falls_back_to_the_commit_spacing_and_says_so(tmp_path):
    ckpt = a_run(tmp_path, ranks=False)
    proc = ckpt_cli("plan", "--ckpt-seconds", "2", "--mtbf-hours", "10", "--run-dir", ckpt, cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr
    assert "step time 0.66 s, from the commit spacing" in proc.stdout and "4 gap(s) between commits in index.jsonl" in proc.stdout
    assert f"steps of {STEP:.3g} s" in proc.stdout


def test_plan_without_a_measured_step_time_names_both_sources_and_the_option(tmp_path):
    ckpt = a_run(tmp_path, ranks=False, commits=False)
    proc = ckpt_cli("plan", "--ckpt-seconds", "2", "--mtbf-hours", "10", "--run-dir", ckpt, cwd=tmp_path.parent)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 3
    assert (
        "no rank step timings (rank_health.*.json)" in err
        and "no two commits of one run" in err
        and "further apart than the checkpoint time (--ckpt-seconds)" in err
        and "--step-seconds" in err
    )


def test_plan_json_has_help():
    proc = ckpt_cli("plan", "--help", cwd=Path("/"))
    line = next(ln for ln in proc.stdout.splitlines() if "--json" in ln)
    assert "Print JSON instead of" in line


def test_plan_marks_no_optimum_when_no_interval_works(tmp_path):
    proc = ckpt_cli("plan", "--ckpt-seconds", "100000", "--mtbf-hours", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no checkpoint interval works" in proc.stdout and "a checkpoint of 100000 s" in proc.stdout
    assert "--local-seconds" in proc.stdout and " *" not in proc.stdout and "checkpoint every" not in proc.stdout
    as_json = json.loads(ckpt_cli("plan", "--ckpt-seconds", "1e7", "--mtbf-hours", "0.1", "--json", cwd=tmp_path).stdout)  # overflowed
    assert as_json["works"] is False and as_json["expected_goodput"] == 0.0
    fine = json.loads(ckpt_cli("plan", "--ckpt-seconds", "90", "--mtbf-hours", "10", "--json", cwd=tmp_path).stdout)
    assert fine["works"] is True
