"""Wrong numbers caught (#35), on the GPT recipe (FSDP2, 2 ranks, under `ckpt run`): a NaN in one
rank's gradient, once, is a transient fault: found, replayed from the checkpoint, the rank named
and its node charged, and the run ends on the trajectory of a run that never saw it, bit for bit;
a batch that makes the loss NaN every time is the data: the replay reproduces it and the run stops
with that explanation, nobody blamed. The conv recipe (DDP: a spike, a skewed replica) and tensor
parallel x FSDP have theirs beside their exactness tests."""

from __future__ import annotations

import json
import math

import pytest

from ckpt_tool.core.node_ledger import fold_health
from ckpt_tool.errors import ExitCode
from ckpt_tool.recipes.launch import compare_runs, read_metrics

from .conftest import ckpt_cli, ckpt_json, edit_one_value, newest_per_step

pytestmark = pytest.mark.slow


def test_a_nan_in_one_ranks_gradient_is_replayed_its_rank_named_and_the_run_ends_exact(reference_run, supervised):
    s = supervised("--corrupt-at-step", "12", "--corrupt-rank", "1")
    assert s.run() == ExitCode.OK, s.log_tail()
    events = s.events()
    [found] = [e for e in events if e["event"] == "anomaly"]
    assert (found["rank"], found["step"], found["field"], found["kind"], found["action"]) == (1, 12, "grad_norm", "nan", "replay"), found
    [verdict] = [e for e in events if e["event"] == "anomaly_replayed"]
    assert (verdict["verdict"], verdict["ranks"], verdict["step"], verdict["action"]) == ("transient", [1], 12, "continue"), verdict
    assert "rank 1 (grad_norm nan -> " in verdict["message"] and "hardware fault" in verdict["message"]
    [fault] = [e for e in events if e["event"] == "silent_fault"]
    assert fault["rank"] == 1 and fault["node"] and fault["differences"].startswith("grad_norm nan -> ")
    # the replay went back to step 10's checkpoint: one restart, not a failure of the crash-loop count
    assert [e["checkpoint"] for e in events if e["event"] == "resumed"] == [10]
    assert not [e for e in events if e["event"] in ("failure_counted", "rank_exited")], events
    # the node of rank 1 is charged, like a crash (one node: counted, nobody to compare it with)
    [node] = fold_health(events).to_json()["nodes"]
    assert node["failures_total"] == 1, node
    # the first run's own line of step 12 was the wrong one; the replay's and all others are the reference's
    lines = read_metrics(s.metrics)
    first12 = [m for m in lines if m.step == 12][0]
    assert math.isnan(first12.grad_norm)
    comparison = compare_runs(reference_run.metrics_lines(), newest_per_step(lines))
    assert comparison.identical and comparison.steps_compared == 40, comparison.mismatches[:3]
    # two runs, one checkpoint each: the one that lost step 12 to a NaN ends where the other does
    same = ckpt_cli("diff", s.ckpt, reference_run.ckpt_dir)
    assert same.returncode == 0 and "identical: all " in same.stdout and "(run: " in same.stdout, same.stdout + same.stderr
    # the run directory says it: anomaly.json, each rank's values, ckpt status
    record = json.loads((s.run_dir / "anomaly.json").read_text())
    assert record["status"] == "done" and record["verdict"] == "transient" and record["from"] == 10
    values = [json.loads(x) for x in (s.run_dir / "metrics" / "rank_1.jsonl").read_text().splitlines()]
    assert [v["step"] for v in values].count(12) == 2 and set(values[0]["values"]) == {"loss", "grad_norm"}
    status = ckpt_cli("status", s.run_dir)
    assert "last wrong value" in status.stdout and "transient fault" in status.stdout and "rank 1" in status.stdout, status.stdout
    assert ckpt_json("status", s.run_dir, "--json")["last_anomaly"]["verdict"] == "transient"


def test_an_audit_finds_a_corruption_no_check_sees_and_names_its_rank(reference_run, supervised):
    """One gradient element of rank 1 x 1.001 at step 17: no NaN, no spike, no loss shows it for
    steps. With --audit-every 4 the save of step 20 first recomputes steps 16-20 from step 15:
    rank 1's own gradient shard differs at step 17, it is named, and the run ends bit-identical;
    the audit of step 40 passes."""
    s = supervised("--audit-every", "4", "--corrupt-at-step", "17", "--corrupt-rank", "1", "--corrupt-kind", "small")
    assert s.run() == ExitCode.OK, s.log_tail()
    events = s.events()
    assert [(e["step"], e["from_step"], e["action"]) for e in events if e["event"] == "audit"] == [(20, 15, "replay"), (40, 35, "replay")]
    assert not [e for e in events if e["event"] == "anomaly"]  # no value was wrong enough to be found
    first, second = [e for e in events if e["event"] == "anomaly_replayed"]
    assert (first["verdict"], first["ranks"], first["differs_at"]) == ("transient", [1], 17), first
    assert "fingerprint:grads" in first["differences"]["1"]
    assert second["verdict"] == "audited" and "audit passed" in second["message"]
    assert [e["rank"] for e in events if e["event"] == "silent_fault"] == [1]
    comparison = compare_runs(reference_run.metrics_lines(), newest_per_step(read_metrics(s.metrics)))
    assert comparison.identical and comparison.steps_compared == 40, comparison.mismatches[:3]


def test_a_batch_that_makes_the_loss_nan_every_time_stops_the_run_and_blames_nobody(supervised):
    s = supervised("--poison-at-step", "12")
    assert s.run() == ExitCode.ANOMALY, s.log_tail()
    events = s.events()
    [verdict] = [e for e in events if e["event"] == "anomaly_replayed"]
    assert (verdict["verdict"], verdict["ranks"], verdict["action"]) == ("reproducible", [], "stop"), verdict
    assert "rank 0: loss is NaN at step 12" in verdict["message"] and "the data or the model, not the hardware" in verdict["message"]
    assert not [e for e in events if e["event"] == "silent_fault"]
    assert not [n for n in fold_health(events).to_json()["nodes"] if n["failures_total"]]  # nobody charged
    [fatal] = [e for e in events if e["event"] == "fatal"]
    assert fatal["exit_code"] == ExitCode.ANOMALY and "wrong value in training" in fatal["message"]
    assert "fix the data or the model" in s.log_tail(20000)
    # where the batch came from: the sampler's position after step 12 (its batch ends there)
    assert json.loads(verdict["data"])["position"] > 0 and "the data's position after step 12" in fatal["message"], fatal
    # nothing after step 10 was committed: the newest checkpoint is from before the NaN
    assert not (s.ckpt / "step_00000015").exists() and (s.ckpt / "step_00000010").exists()


def test_ckpt_replay_of_a_finished_run_is_bit_identical_and_names_an_edited_checkpoints_first_difference(supervised, tmp_path):
    """`ckpt replay` runs the command ckpt run recorded, from a copy of one step: a finished run's
    steps come out bit-identical to its record; an Adam moment doubled by hand (its file's hash
    made to match, so it loads) shows as the first step whose values differ; a weight edited the
    same way is refused at the load (the probe no longer matches). The run's directory is only read."""
    s = supervised(steps=15)
    assert s.run() == ExitCode.OK, s.log_tail()
    before = sorted((p.relative_to(s.ckpt), p.stat().st_mtime_ns) for p in s.ckpt.rglob("*") if "run" not in p.parts)
    same = ckpt_cli("replay", s.ckpt, "--run-dir", s.run_dir, "--from", "10", "--steps", "5", timeout=300)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "steps 11..15 bit-identical to the record (2 ranks, every value)" in same.stdout, same.stdout
    assert "-m ckpt_tool.recipes.tiny_gpt" in same.stdout and "the replay wrote there too" in same.stderr  # its --metrics file
    edit_one_value(s.ckpt, 10, "optim.state.tok.weight.exp_avg")
    proc = ckpt_cli(
        "replay", s.ckpt, "--run-dir", s.run_dir, "--from", "10", "--steps", "5", "--work", tmp_path / "work", "--json", timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    edited = json.loads(proc.stdout)
    diff = edited["difference"]
    assert not edited["identical"] and 11 < diff["step"] <= 15 and diff["rank"] in (0, 1), edited  # the update after it differs
    assert f"step {diff['step']} differs from the record on rank {diff['rank']}" in edited["message"]
    assert (tmp_path / "work" / "replay.log").exists() and edited["work"] == str(tmp_path / "work")
    edit_one_value(s.ckpt, 5, "model.ln_f.weight")  # a weight every token goes through: the probe sees it
    weight = ckpt_cli("replay", s.ckpt, "--run-dir", s.run_dir, "--from", "5", "--steps", "1", timeout=300)
    assert weight.returncode == 1 and "checkpoint step 5 is damaged (verify" in weight.stderr, weight.stderr
    after = sorted((p.relative_to(s.ckpt), p.stat().st_mtime_ns) for p in s.ckpt.rglob("*") if "run" not in p.parts)
    assert [p for p, _ in after] == [p for p, _ in before]  # nothing added or moved in the run's directory by the replays


def test_ckpt_replay_refuses_what_it_cannot_run(ckpt, tmp_path):
    """A run that recorded no command (plain torchrun), a work directory in use, no steps."""
    none = ckpt_cli("replay", ckpt, "--from", "15")
    assert none.returncode == 2 and "no recorded training command" in none.stderr and "-- train.py" in none.stderr, none.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("mine")
    busy = ckpt_cli("replay", ckpt, "--from", "15", "--work", tmp_path / "busy", "--", "train.py")
    assert busy.returncode == 2 and "is not empty" in busy.stderr and (tmp_path / "busy" / "x").read_text() == "mine"
    zero = ckpt_cli("replay", ckpt, "--steps", "0", "--", "train.py")
    assert zero.returncode == 2 and "replay at least one step" in zero.stderr
    missing = ckpt_cli("replay", ckpt, "--from", "7", "--", "train.py")
    assert missing.returncode == 3, missing.stderr
    (ckpt / "run").mkdir(exist_ok=True)
    (ckpt / "run" / "command.json").write_text('{"version": 1, "command": "rm -rf /", "cwd": 5}')  # not what ckpt run writes
    tampered = ckpt_cli("replay", ckpt, "--from", "15")
    assert tampered.returncode == 2 and "is not what ckpt run writes" in tampered.stderr and "Traceback" not in tampered.stderr
    nowhere = ckpt_cli("replay", ckpt, "--from", "15", "--steps", "1", "--", str(tmp_path / "no_such_train.py"), timeout=120)
    assert nowhere.returncode == 1 and "can't open file" in nowhere.stderr and "no_such_train.py" in nowhere.stderr, nowhere.stderr
