"""Hangs explained: before the watchdog kills a hung attempt, every rank's stacks are on disk and
the culprit is named with its file:line, the others as waiting in a collective. Real hangs: a rank
looping in Python (busy), a rank frozen with SIGSTOP, and a live job asked with `ckpt stacks`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from ckpt_tool.core.node_ledger import fold_health
from ckpt_tool.errors import ExitCode

from .conftest import assert_identical_to_reference, ckpt_cli

pytestmark = pytest.mark.slow


def test_a_rank_looping_in_python_is_named_with_its_line_and_the_run_finishes_exact(reference_run, supervised):
    s = supervised("--hang-at-step", "12", "--hang-rank", "1")
    assert s.run() == ExitCode.OK, s.log_tail()
    events = s.events()
    [report] = [e for e in events if e["event"] == "hang_report"]
    assert report["attributed"] and report["culprits"] == [1] and report["victims"] == [0], report
    # the culprit's line of code, and its peer blocked in C inside a collective, answered too
    assert "rank 1 on" in report["summary"] and "faults.py:" in report["summary"] and "in hang_once (" in report["summary"], report
    assert "spins += 1" in report["summary"] or "while True:" in report["summary"], report  # the line, quoted
    assert "rank 0 waiting in all_gather_single after step 11" in report["summary"], report  # FSDP2 unshards for the forward
    stacks = Path(report["stacks"])
    assert stacks.parent == s.run_dir / "hangs"
    culprit, victim = (stacks / "rank_1.txt").read_text(), (stacks / "rank_0.txt").read_text()
    assert "answered=faulthandler" in culprit and "in hang_once" in culprit, culprit
    assert "distributed_c10d.py" in victim and "in all_gather_single" in victim, victim
    assert (stacks / "report.json").exists()
    # the stacks were on disk before the kill, within a bounded time
    kill = next(e for e in events if e["event"] == "killed_ranks")
    assert report["time"] <= kill["time"] and report["stacks_s"] < 5, report
    hang = {e["rank"]: e for e in events if e["event"] == "hang"}
    assert hang[1]["culprit"] and not hang[0]["culprit"] and hang[0]["waiting_in"] == "all_gather_single", hang
    # the health ledger blames the culprit's node, like a crash
    [node] = fold_health(events).to_json()["nodes"]
    assert node["failures_total"] == 1, node  # one node: charged, with nobody to compare it with (unit tests: two)
    assert_identical_to_reference(reference_run, s)
    # ckpt status and ckpt history say it, with the stacks' directory
    status = ckpt_cli("status", s.run_dir)
    assert (
        status.returncode == 0 and "last hang" in status.stdout and "in hang_once" in status.stdout and str(stacks.name) in status.stdout
    ), status.stdout
    history = ckpt_cli("history", s.run_dir)
    assert "hang_report" in history.stdout and "rank 1 on" in history.stdout, history.stdout


def test_a_frozen_rank_is_the_culprit_read_from_outside_or_said_so(reference_run, supervised):
    s = supervised(save_every=10, run_opts=("--grace", "20")).start()
    s.wait_for_step(12)
    victim = s.rank_list()[0]
    victim.send_signal(signal.SIGSTOP)
    assert s.wait() == ExitCode.OK, s.log_tail()
    [report] = [e for e in s.events() if e["event"] == "hang_report"]
    assert report["culprits"] == [0] and report["reason"].startswith("could not answer"), report
    text = (Path(report["stacks"]) / "rank_0.txt").read_text()
    assert "state=stopped" in text, text
    # py-spy (the stacks extra) reads the frozen rank from outside; without it the file says why not
    assert "answered=py-spy" in text or "could_not_answer" in text, text
    assert_identical_to_reference(reference_run, s)


def test_ckpt_stacks_reads_a_live_job_and_the_training_goes_on_exact(reference_run, supervised, tmp_path):
    s = supervised().start()
    s.wait_for_step(8)
    asked = ckpt_cli("stacks", s.run_dir, "--json", timeout=60)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    data = json.loads(asked.stdout)
    assert sorted(v["rank"] for v in data["ranks"]) == [0, 1] and all(v["answered"] == "faulthandler" for v in data["ranks"]), data
    assert Path(data["stacks"], "rank_0.txt").exists() and Path(data["stacks"], "report.json").exists()
    assert data["moving"], data  # every rank beat a moment ago: a snapshot, not a culprit
    text = ckpt_cli("stacks", s.run_dir, timeout=60)  # piped: a table of tab-separated rows
    assert text.returncode == 0 and text.stdout.startswith("rank\tnode\tstep"), text.stdout + text.stderr
    assert "moving: every rank beat in the last" in text.stdout and "\nstacks: " + str(s.run_dir / "hangs") in text.stdout, text.stdout
    assert s.wait() == ExitCode.OK, s.log_tail()
    names = [e["event"] for e in s.events()]
    assert names.count("stacks_written") == 2 and "hang" not in names and "restarted" not in names, names
    assert_identical_to_reference(reference_run, s)  # the dumps changed nothing: same losses, bit for bit
    # after the job: nobody answers; the message says what to do, and no empty directory is left
    before = sorted((s.run_dir / "hangs").iterdir())
    late = ckpt_cli("stacks", s.run_dir, "--wait", "1", timeout=60)
    assert late.returncode == ExitCode.NOT_FOUND and "no rank answered in 1 s" in late.stderr and "ckpt status" in late.stderr, late.stderr
    assert sorted((s.run_dir / "hangs").iterdir()) == before


def test_a_hang_whose_stacks_cannot_be_written_is_still_ended_and_said_so(supervised):
    s = supervised("--hang-at-step", "6", "--hang-rank", "0", steps=12)
    s.run_dir.mkdir(parents=True, exist_ok=True)
    (s.run_dir / "hangs").write_text("not a directory: the stacks cannot go here\n")
    assert s.run() == ExitCode.OK, s.log_tail()
    [report] = [e for e in s.events() if e["event"] == "hang_report"]
    assert not report["attributed"] and report["stacks"] is None and report["reason"].startswith("stacks not written:"), report
    assert any(e["event"] == "killed_ranks" for e in s.events()) and any(e["event"] == "restarted" for e in s.events())
