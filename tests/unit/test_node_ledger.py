"""The health ledger and the node plan (core.node_ledger): events in, decisions out. Pure."""

from __future__ import annotations

from ckpt_tool.core.node_ledger import (
    ACTIVE_EVENT,
    CHECK_EVENT,
    LEAVE_EVENT,
    REPLACED_EVENT,
    Roster,
    classify_crash,
    fold_health,
    plan_nodes,
)

NODES = ("n1", "n2", "n3")


def start(rnd: str, *nodes: str) -> list[dict]:
    return [{"event": "start", "node": n, "round": rnd, "attempt": 0, "time": 0.0} for n in nodes]


def exit_(rnd: str, attempt: int, node: str, cause: str, t: float = 1.0, **kw) -> dict:
    return {
        "event": "rank_exited",
        "node": node,
        "round": rnd,
        "attempt": attempt,
        "cause": cause,
        "rank": 0,
        "local_rank": 0,
        "time": t,
        **kw,
    }


def failure(rnd: str, attempt: int, culprit: str, t: float = 1.0) -> list[dict]:
    """One failure group: the culprit's rank crashed, the others' collectives failed after it."""
    return [exit_(rnd, attempt, culprit, "crashed", t, reason="RuntimeError: CUDA error")] + [
        exit_(rnd, attempt, n, "peer_failure", t + 0.5) for n in NODES if n != culprit
    ]


def test_classify_crash_tells_a_peer_failure_from_a_rank_of_its_own():
    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:50379"
    assert classify_crash("builtins.RuntimeError", gloo) == "peer_failure"
    assert classify_crash("torch.distributed.DistBackendError", "NCCL error in: ...") == "peer_failure"
    assert classify_crash("builtins.RuntimeError", "NCCL communicator was aborted on rank 3") == "peer_failure"
    assert classify_crash("builtins.RuntimeError", "CUDA error: uncorrectable ECC error encountered") == "crashed"
    assert classify_crash("builtins.ValueError", "bad shape") == "crashed"


def test_a_node_blamed_twice_in_a_row_while_the_others_were_fine_is_suspect():
    events = start("r", *NODES) + failure("r", 0, "n3") + failure("r", 1, "n3", 5.0)
    ledger = fold_health(events)
    assert ledger.suspects(2) == ("n3",)
    assert ledger.record("n3").in_a_row == 2 and ledger.record("n3").total == 2 and "CUDA error" in ledger.record("n3").last_reason
    assert ledger.record("n1").total == 0 and ledger.attributed == 2
    assert fold_health(start("r", *NODES) + failure("r", 0, "n3")).suspects(2) == ()  # once is not a pattern


def test_a_fault_that_moves_never_makes_a_suspect():
    events = start("r", *NODES) + failure("r", 0, "n1") + failure("r", 1, "n2") + failure("r", 2, "n3") + failure("r", 3, "n1")
    ledger = fold_health(events)
    assert ledger.suspects(2) == ()
    assert [(r.node, r.total, r.in_a_row) for r in ledger.nodes] == [("n1", 2, 1), ("n2", 1, 0), ("n3", 1, 0)]


def test_a_failure_on_every_node_is_nobodys_and_resets_the_count():
    everywhere = [exit_("r", 1, n, "crashed", reason="ValueError: bug") for n in NODES]
    ledger = fold_health(start("r", *NODES) + failure("r", 0, "n3") + everywhere + failure("r", 2, "n3"))
    assert ledger.record("n3").in_a_row == 1 and ledger.unattributed == 1 and ledger.suspects(2) == ()


def test_one_node_alone_cannot_be_compared_with_anything():
    events = start("r", "n1") + [exit_("r", a, "n1", "crashed") for a in range(4)]
    ledger = fold_health(events)
    assert ledger.suspects(2) == () and ledger.unattributed == 4


def test_a_silent_death_next_to_an_error_is_collateral_and_exits_after_the_round_ended_are_ignored():
    group = [exit_("r", 0, "n3", "crashed"), exit_("r", 0, "n1", "killed", 1.2)]
    after_end = [{"event": "round_ended", "node": "n3", "round": "r", "attempt": 1, "time": 2.0}, exit_("r", 1, "n1", "killed", 2.5)]
    ledger = fold_health(start("r", *NODES) + group + after_end)
    assert ledger.record("n3").in_a_row == 1 and ledger.record("n1").total == 0
    alone = fold_health(start("r", *NODES) + [exit_("r", 0, "n2", "killed")])  # a SIGKILL with nothing else: the node
    assert alone.record("n2").in_a_row == 1


def test_a_hang_blames_the_culprits_node_only():
    hang = [
        {"event": "hang", "node": "n2", "round": "r", "attempt": 0, "culprit": True, "rank": 1, "phase": "step", "step": 7, "time": 1.0},
        {"event": "hang", "node": "n2", "round": "r", "attempt": 0, "culprit": False, "rank": 2, "time": 1.0},
    ]
    assert fold_health(start("r", *NODES) + hang).record("n2").last_reason.startswith("rank 1 (local None) hung in step")


def test_rounds_and_requeues_keep_the_count_and_leaving_nodes_is_remembered():
    events = start("j.0.0", *NODES) + failure("j.0.0", 0, "n3") + start("j.1.0", *NODES) + failure("j.1.0", 0, "n3")
    events.append({"event": LEAVE_EVENT, "drop": ["n3"], "keep": ["n1", "n2"], "reason": "keeps failing", "checkpoint": 10, "time": 9.0})
    ledger = fold_health(events)
    assert ledger.suspects(2) == ("n3",) and ledger.left_behind() == ("n3",) and ledger.leave_checkpoint == 10
    garbage = [{"event": "rank_exited"}, {"node": 3, "round": None}, {"event": "start", "node": "n9"}]
    assert fold_health(garbage + events) == ledger  # events without node and round are not evidence


def suspect_ledger():
    return fold_health(start("r", *NODES) + failure("r", 0, "n3") + failure("r", 1, "n3"))


def test_plan_shrinks_while_enough_nodes_remain_else_requeues_excluding():
    plan = plan_nodes(NODES, suspect_ledger(), 2, newest_checkpoint=10, after_failure=True)
    assert (plan.action, plan.keep, plan.drop, plan.exclude) == ("shrink", ("n1", "n2"), ("n3",), ("n3",))
    assert "n3: 2 failures in a row" in plan.reason
    plan = plan_nodes(NODES, suspect_ledger(), 3, newest_checkpoint=10, after_failure=True)
    assert (plan.action, plan.keep, plan.exclude) == ("requeue", ("n1", "n2"), ("n3",)) and "--min-nodes 3" in plan.reason


def test_plan_stops_when_no_node_is_to_blame_or_the_fault_follows_the_job():
    code_bug = fold_health(start("r", *NODES) + [exit_("r", a, n, "crashed") for a in range(3) for n in NODES])
    plan = plan_nodes(NODES, code_bug, 2, newest_checkpoint=10, after_failure=True)
    assert plan.action == "stop" and "not one node's" in plan.reason and plan.drop == ()
    # n3 was left behind at checkpoint 10; now n2 fails twice with no new checkpoint since
    events = start("r", *NODES) + failure("r", 0, "n3") + failure("r", 1, "n3")
    events.append({"event": LEAVE_EVENT, "drop": ["n3"], "reason": "x", "checkpoint": 10, "time": 3.0})
    events += start("s", "n1", "n2") + [exit_("s", a, "n2", "crashed", 4.0) for a in range(2)] + [exit_("s", 0, "n1", "peer_failure", 4.5)]
    ledger = fold_health(events)
    assert plan_nodes(("n1", "n2"), ledger, 1, newest_checkpoint=10, after_failure=True).action == "stop"
    assert plan_nodes(("n1", "n2"), ledger, 1, newest_checkpoint=15, after_failure=True).action == "shrink"


def test_at_a_start_nodes_left_behind_are_dropped_again():
    ledger = fold_health([{"event": LEAVE_EVENT, "drop": ["n3"], "reason": "x", "checkpoint": 5, "time": 1.0}])
    assert plan_nodes(("n1", "n2"), ledger, 2, 5, after_failure=False).action == "continue"
    plan = plan_nodes(NODES, ledger, 2, 5, after_failure=False)
    assert (plan.action, plan.keep, plan.drop) == ("shrink", ("n1", "n2"), ("n3",))
    assert plan_nodes(("n1", "n3"), ledger, 2, 5, after_failure=False).action == "requeue"


def test_ckpt_run_gives_torchrun_an_elastic_range_a_short_last_call():
    from pathlib import Path

    from ckpt_tool.supervise.run_config import ELASTIC_LAST_CALL_S, RunConfig, torchrun_argv

    fixed = torchrun_argv(RunConfig(("t.py",), Path("/r"), nnodes="3", rdzv_endpoint="h:1"), python="py")
    elastic = torchrun_argv(RunConfig(("t.py",), Path("/r"), nnodes="2:3", rdzv_endpoint="h:1"), python="py")
    assert "--nnodes=3" in fixed and not any(a.startswith("--rdzv-conf") for a in fixed)
    assert "--nnodes=2:3" in elastic and f"--rdzv-conf=last_call_timeout={ELASTIC_LAST_CALL_S}" in elastic
    assert elastic[-1] == "t.py"


def test_a_round_finished_by_the_surviving_nodes_counts_as_finished():
    from ckpt_tool.core.node_ledger import last_round_finished

    events = start("r", *NODES) + [{"event": "finished", "node": n, "round": "r", "time": 5.0} for n in ("n1", "n2")]
    assert last_round_finished(events) == ("n1", "n2")  # n3 was lost with its agent: no event
    assert last_round_finished(events + [{"event": "failed", "node": "n3", "round": "r", "time": 6.0}]) == ()
    assert last_round_finished(start("r", *NODES)) == ()  # nobody finished
    assert last_round_finished(events + start("s", "n1", "n2")) == ()  # a later round has not finished
    assert last_round_finished([]) == ()


def test_events_with_values_of_the_wrong_type_are_not_evidence():
    bad = [exit_("r", 0, "n3", "crashed", t=1.0) | {"attempt": "x"}, exit_("r", 0, "n3", "crashed") | {"time": [1]}]
    events = start("r", *NODES) + bad + failure("r", 1, "n3")
    assert fold_health(events).record("n3").total == 1


def test_plan_says_finished_when_the_surviving_nodes_finished_the_round():
    plan = plan_nodes(("n1", "n2", "n3"), fold_health([]), 2, 10, after_failure=True, finished=("n1", "n2"))
    assert (plan.action, plan.keep, plan.drop) == ("finished", ("n1", "n2"), ())
    assert plan_nodes(NODES, fold_health([]), 2, 10, after_failure=False, finished=("n1",)).action == "continue"


def mark(event: str, node: str, t: float = 2.0, **kw) -> dict:
    return {"event": event, "node": node, "round": "r", "attempt": 0, "time": t, "rank": 5, **kw}


def test_a_gpu_hardware_error_makes_its_node_suspect_at_once_and_says_why():
    ledger = fold_health(start("r", *NODES) + [mark("gpu_error", "n2", gpu=3, xids=[79])])
    assert ledger.suspects(2) == ("n2",) and ledger.record("n2").total == 0
    plan = plan_nodes(NODES, ledger, min_nodes=2, newest_checkpoint=10, after_failure=True)
    assert plan.action == "shrink" and plan.drop == ("n2",) and "GPU 3 (rank 5): XID 79" in plan.reason
    ecc = fold_health(start("r", *NODES) + [mark("gpu_error", "n1", gpu=0, xids=[], ecc_uncorrected_new=2)])
    assert "2 uncorrectable ECC error(s)" in (ecc.record("n1").flagged or "")


def test_a_straggler_is_counted_and_makes_its_node_suspect_only_when_the_run_asked():
    event = mark("straggler", "n3", phase="compute", slower_x=3.1, step=40)
    ledger = fold_health(start("r", *NODES) + [event, {**event, "time": 3.0}])
    assert ledger.record("n3").stragglers == 2 and "compute 3.1x" in ledger.record("n3").last_straggler
    assert ledger.suspects(2) == ()  # reported, not acted on: off by default
    asked = fold_health(start("r", *NODES) + [{**event, "suspect": True}])
    assert asked.suspects(2) == ("n3",) and asked.record("n3").flagged.startswith("straggler: rank 5 compute 3.1x")
    assert [n["stragglers"] for n in asked.to_json()["nodes"] if n["node"] == "n3"] == [1]


def test_a_round_watch_ends_at_once_or_after_the_stops_checkpoint(tmp_path):
    from ckpt_tool.supervise.round_end import RoundEnd, RoundWatch, end_round

    suspect = RoundEnd(["n3"], checkpoint_first=True)
    asks = RoundWatch(tmp_path, "r1", "n1")
    assert asks.take(suspect, ranks_stopped=False, can_ask=True) is True  # training: ask for the checkpoint
    assert (asks.over, asks.after_stop) == (["n3"], True)
    stopped = RoundWatch(tmp_path, "r1", "n1")
    assert stopped.take(suspect, ranks_stopped=True, can_ask=False) is False  # they stopped for it already
    assert stopped.after_stop
    for ended, can_ask in ((RoundEnd(["n3"], checkpoint_first=False), True), (suspect, False)):
        now = RoundWatch(tmp_path, "r1", "n1")  # a node that keeps failing, or no rank to ask: at once
        assert now.take(ended, ranks_stopped=False, can_ask=can_ask) is False
        assert (now.over, now.after_stop) == (["n3"], False)

    reader = RoundWatch(tmp_path, "r1", "n1")
    end_round(tmp_path, "r1", ["n3"], "n3", checkpoint_first=True)
    assert reader.poll(0.5) is None  # read at most once a second
    assert reader.poll(1.6) == suspect and reader.poll(1.7) is None
    reader.take(suspect, ranks_stopped=False, can_ask=True)
    assert reader.marker() is None  # known to be over: not read again
    assert RoundWatch(tmp_path, "r2", "n1").marker() is None  # another round's marker


# --------------------------------------------------------------------------- hot spares


def two_active(culprit: str, rnd: str = "r", attempts: int = 2) -> list[dict]:
    """A round on n1, n2 (n3 stands by) in which ``culprit``'s rank crashes ``attempts`` times."""
    other = "n2" if culprit == "n1" else "n1"
    events = start(rnd, "n1", "n2")
    for a in range(attempts):
        events += [
            exit_(rnd, a, culprit, "crashed", 1.0 + a, reason="RuntimeError: CUDA error"),
            exit_(rnd, a, other, "peer_failure", 1.5 + a),
        ]
    return events


def test_a_standby_takes_the_suspects_slot_keeping_size_order_and_world():
    plan = plan_nodes(NODES, fold_health(two_active("n1")), 1, 10, after_failure=True, roster=Roster(train_nodes=2, active=("n1", "n2")))
    assert (plan.action, plan.keep, plan.drop, plan.exclude) == ("replace", ("n2", "n3"), ("n1",), ("n1",))
    assert plan.active == ("n2", "n3") and plan.standby == () and plan.replaced == (("n1", "n3"),)
    assert "replacing n1 with n3 (n1: 2 failures in a row" in plan.reason and "0 standby left" in plan.reason
    assert plan.script_fields() == ("replace", "n2,n3", "n1", "n1", "n2,n3", "-", "n1:n3")
    # the replace needs no --min-nodes: a job that may not shrink still keeps its size
    assert plan_nodes(NODES, fold_health(two_active("n1")), 2, 10, True, roster=Roster(2, ("n1", "n2"))).action == "replace"
    # with no standby left the same failure shrinks (min 1) or requeues (min 2), as without spares
    assert plan_nodes(("n1", "n2"), fold_health(two_active("n1")), 1, 10, True, roster=Roster(2, ("n1", "n2"))).action == "shrink"
    assert plan_nodes(("n1", "n2"), fold_health(two_active("n1")), 2, 10, True, roster=Roster(2, ("n1", "n2"))).action == "requeue"


def test_at_the_start_the_first_train_nodes_run_and_the_rest_stand_by():
    plan = plan_nodes(NODES, fold_health([]), 2, None, after_failure=False, roster=Roster(train_nodes=2))
    assert (plan.action, plan.active, plan.standby) == ("continue", ("n1", "n2"), ("n3",))
    # a node left behind before and handed back by SLURM: given back again, the standby trains in its place
    ledger = fold_health([{"event": LEAVE_EVENT, "drop": ["n1"], "reason": "x", "checkpoint": 5, "time": 1.0}])
    plan = plan_nodes(NODES, ledger, 2, 5, after_failure=False, roster=Roster(train_nodes=2))
    assert (plan.action, plan.drop, plan.active, plan.replaced) == ("shrink", ("n1",), ("n2", "n3"), ())


def test_two_failing_nodes_one_spare_replace_then_shrink_and_the_guard_still_holds():
    events = two_active("n1")
    events += [
        {"event": LEAVE_EVENT, "action": "replace", "drop": ["n1"], "keep": ["n2", "n3"], "reason": "x", "checkpoint": 10, "time": 3.0}
    ]
    events += [{"event": REPLACED_EVENT, "node": "n1", "by": "n3", "reason": "2 failures", "time": 3.0}]
    events += [{"event": ACTIVE_EVENT, "active": "n2,n3", "standby": "-", "time": 3.5}]
    events += [{**e, "time": e["time"] + 10} for e in two_active("n3", "s")]  # the spare fails too
    ledger = fold_health(events)
    assert ledger.active == ("n2", "n3") and ledger.standby == () and ledger.replaced == (("n1", "n3", "2 failures"),)
    roster = Roster(train_nodes=2, active=ledger.active)
    plan = plan_nodes(("n2", "n3"), ledger, 1, 20, after_failure=True, roster=roster)
    assert (plan.action, plan.keep, plan.drop, plan.active) == ("shrink", ("n2",), ("n3",), ("n2",)) and "no standby left" in plan.reason
    # the same with no checkpoint since the replacement: the fault follows the job, nothing more is left behind
    assert plan_nodes(("n2", "n3"), ledger, 1, 10, after_failure=True, roster=roster).action == "stop"
    assert ledger.to_json()["replaced"] == [{"node": "n1", "by": "n3", "reason": "2 failures"}]


def test_a_moving_fault_or_a_bug_everywhere_replaces_nobody_and_leaves_the_spare():
    moving = start("r", "n1", "n2") + [
        exit_("r", 0, "n1", "crashed"),
        exit_("r", 1, "n2", "crashed", 2.0),
        exit_("r", 2, "n1", "crashed", 3.0),
    ]
    bug = start("r", "n1", "n2") + [exit_("r", a, n, "crashed", reason="ValueError: bug") for a in range(3) for n in ("n1", "n2")]
    for events in (moving, bug):
        plan = plan_nodes(NODES, fold_health(events), 1, 10, after_failure=True, roster=Roster(train_nodes=2, active=("n1", "n2")))
        assert (plan.action, plan.drop, plan.replaced, plan.standby) == ("stop", (), (), ("n3",))


def test_a_standby_is_checked_before_it_takes_a_slot_and_one_that_fails_is_left_behind():
    roster = Roster(train_nodes=2, active=("n1", "n2"), node_check=True)
    plan = plan_nodes(NODES, fold_health(two_active("n1")), 1, 10, after_failure=True, roster=roster)
    assert (plan.action, plan.check) == ("check", ("n3",)) and "checking standby n3" in plan.reason
    passed = Roster(2, ("n1", "n2"), True, checked=("n3",))
    assert plan_nodes(NODES, fold_health(two_active("n1")), 1, 10, True, roster=passed).action == "replace"
    failed = two_active("n1") + [
        {"event": CHECK_EVENT, "node": "n3", "result": "failed", "exit_code": 1, "detail": "dcgmi: PCIe", "time": 4.0}
    ]
    ledger = fold_health(failed)
    assert ledger.record("n3").flagged == "node check failed (dcgmi: PCIe)"
    plan = plan_nodes(NODES, ledger, 1, 10, after_failure=True, roster=roster)
    assert (plan.action, plan.drop, plan.active, plan.replaced) == ("shrink", ("n1", "n3"), ("n2",), ())
    assert plan_nodes(NODES, ledger, 2, 10, after_failure=True, roster=roster).action == "requeue"
    ok = {"event": CHECK_EVENT, "node": "n3", "result": "passed", "exit_code": 0, "time": 4.0}
    assert fold_health([*two_active("n1"), ok]).record("n3").flagged is None


def test_for_script_prints_four_fields_to_scripts_that_know_no_spares_and_seven_with_train_nodes(tmp_path):
    """A batch script queued before spares reads `read -r ACTION KEEP DROP EXCLUDE`: it must get
    four fields, or EXCLUDE would swallow the rest; `--train-nodes` asks for the hot-spare fields."""
    import json
    import subprocess
    import sys

    run = tmp_path / "ckpt" / "run"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in two_active("n2")))
    base = [sys.executable, "-m", "ckpt_tool.cli.main", "nodes", str(tmp_path / "ckpt"), "--nodes", "n1,n2,n3", "--after-failure"]
    old = subprocess.run([*base, "--for-script"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert old.returncode == 0, old.stderr
    assert old.stdout.split() == ["shrink", "n1,n3", "n2", "n2"] and "ckpt nodes: shrink" in old.stderr
    read = subprocess.run(
        ["bash", "-c", 'read -r ACTION KEEP DROP EXCLUDE <<<"$1"; echo "$EXCLUDE"', "-", old.stdout], capture_output=True, text=True
    )
    assert read.stdout.strip() == "n2"
    (run / "events.jsonl").write_text(  # the same run before that decision was recorded
        "".join(json.dumps(e) + "\n" for e in two_active("n2"))
    )
    new = subprocess.run([*base, "--for-script", "--train-nodes", "2"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    assert new.stdout.split() == ["replace", "n1,n3", "n2", "n2", "n1,n3", "-", "n2:n3"], new.stdout
