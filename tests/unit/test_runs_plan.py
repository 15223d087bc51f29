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


# `ckpt plan --nodes`: what hot spares buy (core.spares_model), the words and numbers a user reads

SPARES = ("--nodes", "8", "--spares", "1", "--node-mtbf-hours", "2000", "--job-hours", "168", "--min-nodes", "6")


def plan_main(capsys, *args: str) -> tuple[int, str, str]:
    """``ckpt plan ARGS`` in this process: exit code, stdout, stderr (its whitespace folded)."""
    from ckpt_tool.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["plan", *args])
    got = capsys.readouterr()
    return e.value.code or 0, got.out, " ".join(got.err.split())


def test_plan_spares_prints_both_plans_and_what_the_spare_buys(capsys):
    from ckpt_tool.core.spares_model import compare_spares

    code, text, err = plan_main(capsys, *SPARES)
    assert code == 0, err
    c = compare_spares(8, 1, 2000, 168, 6)
    head, header, spare_row, none_row = text.splitlines()  # in a pipe: the headline, then the table as tab-separated lines
    assert (
        head.startswith(f"1 spare buys {c.wall_hours_saved:.2f} h of wall time")
        and f"costs {c.node_hours_extra:.1%} more node-hours" in head
    )
    assert "better by wall time, worse by node-hours than no spares (shrink)" in head
    assert header.split("\t") == [
        "plan",
        "wall_hours",
        "goodput",
        "node_hour_efficiency",
        "mean_nodes_active",
        "replacements",
        "shrinks",
        "requeues",
    ]
    assert spare_row.split("\t")[:4] == [
        "1 spare",
        f"{c.with_spares.wall_hours:.2f}",
        f"{c.with_spares.goodput:.2%}",
        f"{c.with_spares.node_hour_efficiency:.2%}",
    ]
    assert none_row.split("\t")[0] == "no spares (shrink)" and none_row.split("\t")[6] == f"{c.without.shrinks:.2f}"


def test_plan_spares_json_holds_both_scenarios_as_the_model_computes_them(capsys):
    from ckpt_tool.core.spares_model import compare_spares

    code, text, err = plan_main(capsys, *SPARES, "--json")
    assert code == 0, err
    got = json.loads(text)
    c = compare_spares(8, 1, 2000, 168, 6, requeue_wait_hours=1.0, restart_seconds=300.0)
    assert got["restart_seconds"] == 300.0 and got["requeue_wait_hours"] == 1.0 and got["min_nodes"] == 6  # the defaults, said
    assert got["expected_failures"] == pytest.approx(8 * 168 / 2000)
    for key, scenario in (("with_spares", c.with_spares), ("no_spares", c.without)):
        for field in ("wall_hours", "goodput", "node_hour_efficiency", "mean_nodes_active", "replacements", "shrinks", "requeues"):
            assert got[key][field] == pytest.approx(getattr(scenario, field), abs=1e-6), (key, field)
    assert got["with_spares"]["spares"] == 1 and got["no_spares"]["spares"] == 0
    assert got["better_by_wall"] == "spares" and got["better_by_node_hours"] == "no spares"
    assert got["wall_hours_saved"] == pytest.approx(c.wall_hours_saved, abs=1e-6) and c.wall_hours_saved > 0


def test_plan_spares_without_shrink_requeues_and_takes_the_given_costs(capsys):
    args = ("--nodes", "16", "--spares", "2", "--node-mtbf-hours", "200", "--job-hours", "100")
    code, text, err = plan_main(capsys, *args, "--requeue-wait-hours", "6", "--restart-seconds", "0", "--json")
    assert code == 0, err
    got = json.loads(text)
    assert got["min_nodes"] == 16 and got["no_spares"]["shrinks"] == 0
    assert got["no_spares"]["requeues"] == pytest.approx(8.0) and got["no_spares"]["wall_hours"] == pytest.approx(100 + 8 * 6)
    assert got["better_by_node_hours"] == "spares"  # 2 idle nodes cost less than the queue waits they spare
    code, text, err = plan_main(capsys, *args, "--requeue-wait-hours", "6")
    assert "2 spares buy " in text and "save " in text and "no spares (requeue)" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (("--node-mtbf-hours", "-5"), "--node-mtbf-hours must be a positive number, got -5"),
        (("--node-mtbf-hours", "nan"), "--node-mtbf-hours must be a positive number, got nan"),
        (("--job-hours", "0"), "--job-hours must be a positive number, got 0"),
        (("--spares", "-1"), "--spares must be a whole number of at least 0, got -1"),
        (("--nodes", "0"), "--nodes must be a whole number of at least 1, got 0"),
        (("--min-nodes", "9"), "--min-nodes must be between 1 and --nodes (8), got 9"),
        (("--min-nodes", "0"), "--min-nodes must be between 1 and --nodes (8), got 0"),
        (("--requeue-wait-hours", "-1"), "--requeue-wait-hours must be a non-negative number, got -1"),
        (("--restart-seconds", "-3"), "--restart-seconds must be a non-negative number, got -3"),
        (("--node-mtbf-hours", "1e-6"), "is 1.34e+09 expected failures per job, beyond what this plan models (1e+06)"),
    ],
)
def test_plan_spares_names_the_option_and_the_value_typed(capsys, args, message):
    given = dict(zip(SPARES[::2], SPARES[1::2], strict=True))
    given.update(zip(args[::2], args[1::2], strict=True))
    code, text, err = plan_main(capsys, *(w for pair in given.items() for w in pair))
    assert code == 2 and message in err and text == ""
    assert "Traceback" not in err


def test_plan_refuses_mixed_modes_and_says_both_ways_when_given_neither(capsys):
    code, _, err = plan_main(capsys, *SPARES, "--ckpt-seconds", "90", "--local-covers", "0.5")
    assert code == 2
    assert (
        "--ckpt-seconds, --local-covers (a checkpoint interval) and --nodes, --spares, --node-mtbf-hours, --job-hours, --min-nodes (what spares buy)"
        in err
    )
    both = "give --ckpt-seconds with --mtbf-hours (interval), or --nodes with --node-mtbf-hours and --job-hours (spares)"
    assert both in err
    for nothing in ((), ("--json",), ("--restart-seconds", "30")):
        code, text, err = plan_main(capsys, *nothing)
        assert code == 2 and both in err and text == "", nothing
    code, _, err = plan_main(capsys, "--nodes", "8", "--spares", "2")
    assert code == 2 and "needs --nodes, --node-mtbf-hours and --job-hours: --node-mtbf-hours, --job-hours missing" in err
    code, _, err = plan_main(capsys, "--mtbf-hours", "10")  # the interval mode still names its own missing option
    assert code == 2 and "missing option --ckpt-seconds (with --mtbf-hours)" in err


def test_plan_interval_mode_is_unchanged_by_the_spares_options(capsys):
    code, text, err = plan_main(capsys, "--ckpt-seconds", "90", "--mtbf-hours", "10", "--json")
    assert code == 0, err
    assert json.loads(text)["interval_seconds"] == pytest.approx(plan_interval(90, 36000).interval_s, abs=1e-3)  # restart 0 by default
    code, text, err = plan_main(capsys, "--ckpt-seconds", "90", "--mtbf-hours", "10", "--restart-seconds", "300", "--json")
    assert json.loads(text)["expected_goodput"] == pytest.approx(plan_interval(90, 36000, 300).goodput, abs=1e-6)
    code, _, err = plan_main(capsys, "--ckpt-seconds", "90", "--gpus", "5")
    assert code == 2 and "give either --mtbf-hours, or --gpus with --gpu-mtbf-hours" in err
