"""The job chain's decisions (slurm/chain.py) with plain data, through every branch: what the
batch script's bash decided until #31, event by event, with the words and events it wrote."""

from __future__ import annotations

import pytest

from ckpt_tool.slurm.chain import (
    AskNodes,
    AskSlurm,
    ChainConfig,
    ChainState,
    CheckNodes,
    Exclude,
    ExcludeDone,
    Exit,
    ForwardStop,
    Log,
    NodesChecked,
    NodesSaid,
    Note,
    RecoverExited,
    Requeue,
    RequeueDone,
    RunExited,
    RunSpec,
    Shrink,
    ShrinkDone,
    SignalArrived,
    SlurmSaid,
    Started,
    StartRecover,
    StartRun,
    exit_status,
    nnodes,
    parse_resize_script,
    round_id,
    round_ready,
    srun_argv,
    step,
    stopped_by_slurm,
)

CFG = ChainConfig(job_id="41", restart=1, max_requeues=3, min_nodes=2)


def walk(*events, cfg: ChainConfig = CFG, state: ChainState | None = None):
    """Feed ``events`` in order; the final state and every action, in order."""
    st = state or ChainState()
    actions = []
    for ev in events:
        st, done = step(cfg, st, ev)
        actions += done
    return st, actions


def notes(actions) -> list[tuple[str, dict]]:
    return [(a.event, dict(a.fields)) for a in actions if isinstance(a, Note)]


def logs(actions) -> str:
    return "\n".join(a.text for a in actions if isinstance(a, Log))


def kinds(actions) -> list[type]:
    return [type(a) for a in actions if not isinstance(a, Log | Note)]


STARTED = (Started("n[1-2]"), NodesSaid("continue", "n1,n2", "-", "-"), RecoverExited(0))


def test_a_start_notes_asks_the_nodes_recovers_and_runs_the_first_round():
    st, actions = walk(*STARTED)
    assert notes(actions) == [("job_start", {"job_id": "41", "restarts": "1", "nodes": "n[1-2]"})]
    assert "ready: trap installed" in logs(actions)
    assert kinds(actions) == [AskNodes, StartRecover, StartRun]
    assert actions[-1] == StartRun(0) and st.phase == "run"


def test_exit_0_is_finished():
    st, actions = walk(*STARTED, RunExited(0))
    assert notes(actions)[-1] == ("job_finished", {})
    assert actions[-1] == Exit(0)
    assert "ckpt run exited with 0\ntraining finished" in logs(actions)


def test_exit_75_requeues_and_the_term_of_our_own_requeue_decides_nothing():
    st, actions = walk(*STARTED, RunExited(75))
    assert notes(actions)[-1] == (
        "requeue",
        {"restarts": "1", "exclude": "-", "reason": "stopped by the training (asked) after a checkpoint"},
    )
    assert actions[-1] == Requeue()
    assert "requeuing (restart 1 of at most 3)" in logs(actions)
    st, more = walk(SignalArrived("TERM"), RequeueDone(True), state=st)
    assert AskSlurm() not in more  # our TERM: no scancel check, no cancelled event
    assert [e for e, _ in notes(more)] == [] and more[-1] == Exit(0)


def test_exit_75_at_max_requeues_stops_with_75():
    _, actions = walk(*STARTED, RunExited(75), cfg=ChainConfig("41", restart=3, max_requeues=3, min_nodes=2))
    assert notes(actions)[-1] == ("max_requeues_reached", {"restarts": "3", "limit": "3"})
    assert actions[-1] == Exit(75)
    assert "max requeues reached (3 of 3): not requeuing; resume by hand with ckpt submit" in logs(actions)


def test_no_scontrol_cannot_requeue_and_says_so():
    _, actions = walk(*STARTED, RunExited(75), cfg=ChainConfig("41", 0, 3, 2, scontrol=False))
    assert notes(actions)[-1] == ("requeue_failed", {"reason": "no-scontrol"})
    assert actions[-1] == Exit(75) and "scontrol is not available here" in logs(actions)


def test_a_failed_scontrol_requeue_exits_75():
    _, actions = walk(*STARTED, RunExited(75), RequeueDone(False))
    assert actions[-2:] == [Log("scontrol requeue failed"), Exit(75)]


def test_a_term_from_scancel_is_recorded_at_once_and_the_job_stops_without_requeue():
    st, actions = walk(*STARTED, SignalArrived("TERM"))
    assert actions[-2:] == [ForwardStop(), AskSlurm()]
    st, actions = walk(SlurmSaid("RUNNING", "None"), state=st)
    assert notes(actions) == [("cancelled", {"cause": "scancel", "requeued": "no", "restarts": "1"})]  # before the checkpoint ends
    assert st.cancelled and not [a for a in actions if isinstance(a, Exit)]
    st, actions = walk(RunExited(75), state=st)
    assert notes(actions) == [("job_stopped", {"cause": "scancel", "requeued": "no", "restarts": "1"})]
    assert Requeue() not in actions and actions[-1] == Exit(0)


@pytest.mark.parametrize(
    "job_state, reason, cause",
    [
        ("TIMEOUT", "TimeLimit", "time-limit"),
        ("RUNNING", "TimeLimit", "time-limit"),
        ("PREEMPTED", "None", "preemption"),
        ("RUNNING", "Preempted", "preemption"),
    ],
)
def test_a_term_from_slurm_itself_requeues(job_state, reason, cause):
    st, actions = walk(*STARTED, SignalArrived("TERM"), SlurmSaid(job_state, reason), RunExited(75))
    assert [e for e, _ in notes(actions)] == ["job_start", "requeue"]
    assert notes(actions)[-1][1]["reason"] == f"stopped by TERM ({cause}) after a checkpoint"
    assert actions[-1] == Requeue()


def test_stopped_by_slurm_tells_scancel_by_elimination():
    assert stopped_by_slurm("", "") is None  # scontrol did not answer: taken for scancel, as bash did
    assert stopped_by_slurm("CANCELLED", "None") is None


def test_usr1_first_then_term_requeues_the_first_signal_decides():
    st, actions = walk(*STARTED, SignalArrived("USR1"), SignalArrived("TERM"), RunExited(75))
    assert AskSlurm() not in actions  # the TERM is not first: no scancel check
    assert actions.count(ForwardStop()) == 2
    assert notes(actions)[-1][1]["reason"] == "stopped by USR1 (time-limit warning or scancel --signal=USR1) after a checkpoint"
    assert actions[-1] == Requeue()


@pytest.mark.parametrize("rc", [138, 143, 1])  # killed by USR1/TERM before ckpt run's handler (128+n), or any failure
def test_asked_to_stop_requeues_whatever_the_exit(rc):
    _, actions = walk(*STARTED, SignalArrived("USR1"), RunExited(rc))
    assert f"ckpt run exited with {rc}" in logs(actions)
    assert actions[-1] == Requeue() and AskNodes(after_failure=True) not in actions


def test_exit_status_is_the_shells():
    assert exit_status(-10) == 138 and exit_status(75) == 75


def test_recover_failing_stops_without_training():
    _, actions = walk(Started("n1"), NodesSaid("continue"), RecoverExited(3))
    assert actions[-2:] == [Log("ckpt recover failed (exit 3): not starting training"), Exit(3)]
    assert StartRun(0) not in actions


def test_a_signal_during_recover_requeues_after_it_even_when_it_failed():
    for rc in (0, 138):
        _, actions = walk(Started("n1"), NodesSaid("continue"), SignalArrived("USR1"), RecoverExited(rc))
        assert actions[-1] == Requeue() and StartRun(0) not in actions


def test_a_signal_before_the_first_round_skips_recover_and_requeues():
    _, actions = walk(Started("n1"), SignalArrived("USR1"), NodesSaid("continue"))
    assert StartRecover() not in actions and actions[-1] == Requeue()


def test_nodes_failing_goes_on_at_the_start_and_stops_after_a_failure():
    _, actions = walk(Started("n1"), NodesSaid(None))
    assert actions[-1] == StartRecover()
    _, actions = walk(*STARTED, RunExited(1), NodesSaid(None))
    assert notes(actions)[-1] == ("job_failed", {"exit_code": "1"}) and actions[-1] == Exit(1)


def test_stop_at_the_start_trains_anyway():
    _, actions = walk(Started("n1"), NodesSaid("stop"))
    assert actions[-1] == StartRecover()


def test_a_failed_round_and_nodes_continue_starts_the_next_round():
    st, actions = walk(*STARTED, RunExited(77), NodesSaid("continue", "n1,n2"), RecoverExited(0))
    assert AskNodes(after_failure=True) in actions
    assert actions[-1] == StartRun(1) and st.round == 1


def test_a_failed_round_and_nodes_stop_is_the_trainings_failure():
    _, actions = walk(*STARTED, RunExited(76), NodesSaid("stop", "n1,n2"))
    assert "training failed (exit 76), not a node's fault: not requeuing (see ckpt status)" in logs(actions)
    assert notes(actions)[-1] == ("job_failed", {"exit_code": "76"}) and actions[-1] == Exit(76)


@pytest.mark.parametrize(
    "rc, words",
    [
        (79, "a wrong value the replay reproduced: the data or the model"),
        (78, "saves kept failing: the disk"),
        (2, "bad arguments or input"),
    ],
)
def test_a_round_that_ends_on_an_error_no_restart_fixes_ends_the_job_without_asking_the_nodes(rc, words):
    _, actions = walk(*STARTED, RunExited(rc))
    assert not [a for a in actions if isinstance(a, AskNodes) and a.after_failure]
    assert f"training stopped on an error a restart cannot fix (exit {rc}: {words}): not requeuing" in logs(actions)
    assert notes(actions)[-1] == ("job_failed", {"exit_code": str(rc)}) and actions[-1] == Exit(rc)


def test_shrink_leaves_the_node_behind_and_goes_on_with_the_next_round():
    st, actions = walk(*STARTED, RunExited(77), NodesSaid("shrink", "n1", "n2", "-"))
    assert actions[-1] == Shrink("n1")
    st, actions = walk(ShrinkDone("n1", "1"), RecoverExited(0), state=st)
    assert notes(actions) == [("shrunk", {"dropped": "n2", "nodes": "n1", "num_nodes": "1"})]
    assert "left n2 behind: going on with 1 node(s) (n1)" in logs(actions)
    assert actions[-1] == StartRun(1)


def test_a_shrink_that_fails_requeues_instead():
    st, actions = walk(*STARTED, RunExited(77), NodesSaid("shrink", "n1", "n2", "n2"), ShrinkDone(None))
    assert "scontrol update NodeList=n1 failed: requeuing instead" in logs(actions)
    assert notes(actions)[-1] == ("requeue", {"restarts": "1", "exclude": "n2", "reason": "could not leave n2 behind"})
    assert actions[-1] == Requeue()


def test_requeue_excluding_the_bad_nodes_retries_exclusion_then_exits_0():
    st, actions = walk(*STARTED, RunExited(77), NodesSaid("requeue", "n1", "n2", "n2"))
    assert notes(actions)[-1] == ("requeue", {"restarts": "1", "exclude": "n2", "reason": "too few healthy nodes: need 2"})
    st, actions = walk(RequeueDone(True), state=st)
    assert actions == [Exclude("n2")]
    st, actions = walk(SignalArrived("TERM"), ExcludeDone(True), state=st)  # the requeue's TERM meanwhile
    assert AskSlurm() not in actions
    assert notes(actions) == [("excluded", {"nodes": "n2"})] and actions[-1] == Exit(0)
    _, actions = walk(ExcludeDone(False), state=st)
    assert notes(actions) == [] and actions == [Exit(0)]


def test_nodes_finished_ends_the_job():
    _, actions = walk(*STARTED, RunExited(1), NodesSaid("finished"))
    assert notes(actions)[-1] == ("job_finished", {}) and actions[-1] == Exit(0)


def test_the_rounds_command_line():
    spec = RunSpec(
        ckpt=("py", "-m", "ckpt_tool.cli.main"), ckpt_dir="/c", run_dir="/c/run", command=("train.py", "--x", "a b"), min_nodes=2
    )
    argv = srun_argv(spec, "41", 1, 2, 3, "10.0.0.1:2345")
    assert argv[:5] == ["srun", "--kill-on-bad-exit=0", "--ntasks-per-node=1", "--nodes=3", "--ntasks=3"]
    assert argv[argv.index("--nnodes") + 1] == "2:3" and argv[argv.index("--rdzv-id") + 1] == "41.1.2"
    assert argv[argv.index("--") + 1 :] == ["train.py", "--x", "a b"]
    assert nnodes(2, 2) == "2" and nnodes(1, 3) == "1:3"


def test_the_resize_script_is_read_as_its_exports():
    text = 'export SLURM_NODELIST="n1"\nexport SLURM_JOB_NODELIST="n1"\nexport SLURM_JOB_NUM_NODES=1\n# comment\necho hi\n'
    assert parse_resize_script(text) == {"SLURM_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}


# --------------------------------------------------------------------------- hot spares

SPARE_START = (Started("n[1-3]"), NodesSaid("continue", "n1,n2,n3", "-", "-", "n1,n2"), RecoverExited(0))


def test_a_round_runs_on_the_active_nodes_and_notes_the_standbys():
    st, actions = walk(*SPARE_START)
    assert actions[-1] == StartRun(0, "n1,n2") and StartRecover("n1,n2") in actions
    assert ("nodes_active", {"active": "n1,n2", "standby": "n3", "round": "0"}) in notes(actions)


def test_a_replace_gives_the_suspect_back_and_runs_the_next_round_on_the_same_number_of_nodes():
    replace_said = NodesSaid("replace", "n1,n3", "n2", "n2", "n1,n3", "-", "n2:n3")
    st, actions = walk(*SPARE_START, RunExited(77), replace_said, ShrinkDone("n1,n3", "2"), RecoverExited(0))
    assert AskNodes(after_failure=True, active="n1,n2") in actions
    assert Shrink("n1,n3") in actions and actions[-1] == StartRun(1, "n1,n3")
    assert "replaced n2 with n3: going on with 2 node(s) (n1,n3)" in logs(actions)
    assert ("nodes_active", {"active": "n1,n3", "standby": "-", "round": "1"}) in notes(actions)


def test_a_check_runs_before_the_standby_takes_a_slot_and_its_result_is_asked_about():
    st, actions = walk(*SPARE_START, RunExited(77), NodesSaid("check", "n1,n3", "n2", "n2", "n1,n3", "n3"))
    assert actions[-1] == CheckNodes("n3") and st.active == "n1,n2"  # the round's nodes stay until the answer
    st, actions = walk(NodesChecked("n3", "-"), state=st)
    assert actions[-1] == AskNodes(after_failure=True, active="n1,n2", checked="n3")
    assert "node check: passed n3, failed -" in logs(actions)
    # a signal while the check ran: no next round, requeue
    st, _ = walk(*SPARE_START, RunExited(77), NodesSaid("check", "n1,n3", "n2", "n2", "n1,n3", "n3"), SignalArrived("USR1"))
    _, actions = walk(NodesChecked("n3", "-"), state=st)
    assert actions[-1] == Requeue()


def test_node_check_at_start_checks_every_node_before_the_first_question():
    cfg = ChainConfig(job_id="41", restart=0, max_requeues=3, min_nodes=2, node_check_at_start=True)
    st, actions = walk(Started("n[1-3]"), cfg=cfg)
    assert actions[-1] == CheckNodes() and AskNodes(after_failure=False) not in actions
    _, actions = walk(NodesChecked("n1,n2", "n3"), cfg=cfg, state=st)
    assert actions[-1] == AskNodes(after_failure=False, checked="n1,n2")


def test_the_rounds_command_line_names_the_active_nodes():
    spec = RunSpec(ckpt=("py",), ckpt_dir="/c", run_dir="/c/run", command=("t.py",), min_nodes=2)
    argv = srun_argv(spec, "41", 0, 1, 2, "10.0.0.1:2345", ["n1", "n3"])
    assert argv[:6] == ["srun", "--kill-on-bad-exit=0", "--ntasks-per-node=1", "--nodes=2", "--ntasks=2", "--nodelist=n1,n3"]


def test_a_round_is_ready_once_each_of_its_nodes_logged_start():
    """The stop waits for this: every node's ckpt run of this round has its handler in."""
    rid = round_id("41", 1, 2)
    assert rid == "41.1.2"
    start = lambda node, rnd=rid: {"event": "start", "node": node, "round": rnd}  # noqa: E731
    assert not round_ready([], rid, 2)
    assert not round_ready([start("n1"), start("n1")], rid, 2)  # one node twice is one node
    assert not round_ready([start("n1"), start("n2", "41.1.1")], rid, 2)  # the other start is of the round before
    assert not round_ready([start("n1"), {"event": "ranks_started", "node": "n2", "round": rid}], rid, 2)
    assert round_ready([start("n2"), {"event": "hang"}, start("n1")], rid, 2)


# --------------------------------------------------------------------------- what the user is told (--notify)


def told(actions) -> list[tuple[str, dict]]:
    from ckpt_tool.slurm.chain import Notify

    return [(a.event, dict(a.fields)) for a in actions if isinstance(a, Notify)]


def test_each_end_of_the_job_is_told_once_with_the_fields_it_is_recorded_with():
    cfg_max = ChainConfig("41", restart=3, max_requeues=3, min_nodes=2)
    cfg_bare = ChainConfig("41", 0, 3, 2, scontrol=False)
    ends = {
        "finished": walk(*STARTED, RunExited(0))[1],
        "nodes said finished": walk(*STARTED, RunExited(1), NodesSaid("finished"))[1],
        "max requeues": walk(*STARTED, RunExited(75), cfg=cfg_max)[1],
        "no scontrol": walk(*STARTED, RunExited(75), cfg=cfg_bare)[1],
        "requeue refused": walk(*STARTED, RunExited(75), RequeueDone(False))[1],
    }
    assert {k: told(v) for k, v in ends.items()} == {
        "finished": [("job_finished", {})],
        "nodes said finished": [("job_finished", {})],
        "max requeues": [("max_requeues_reached", {"restarts": "3", "limit": "3"})],
        "no scontrol": [("requeue_failed", {"reason": "no-scontrol"})],
        "requeue refused": [("requeue", {"restarts": "1", "exclude": "-", "reason": "stopped by the training (asked) after a checkpoint"}),
                            ("requeue_failed", {"reason": "scontrol-requeue-failed"})],
    }  # fmt: skip
    for actions in ends.values():  # told before the exit, after the event is recorded
        notify_at = max(i for i, a in enumerate(actions) if type(a).__name__ == "Notify")
        assert isinstance(actions[-1], Exit) and notify_at < len(actions) - 1
    assert notes(ends["requeue refused"])[-1] == ("requeue_failed", {"reason": "scontrol-requeue-failed"})  # ckpt status: its final state


@pytest.mark.parametrize(
    "events, rc, reason",
    [
        ((*STARTED, RunExited(76), NodesSaid("stop", "n1,n2")), 76, "crash_loop"),  # the breaker: no node to blame
        ((*STARTED, RunExited(78)), 78, "save_failed"),  # saves kept failing: no restart helps
        ((*STARTED, RunExited(79)), 79, "reproducible_anomaly"),
        ((*STARTED, RunExited(1), NodesSaid(None)), 1, "restarts_exhausted"),
        ((Started("n1"), NodesSaid("continue"), RecoverExited(3)), 3, "recover_failed"),
    ],
)
def test_a_failed_job_is_told_why_from_ckpt_runs_exit_code(events, rc, reason):
    _, actions = walk(*events)
    assert told(actions) == [("job_failed", {"exit_code": str(rc), "reason": reason})]
    assert notes(actions)[-1] == ("job_failed", {"exit_code": str(rc)}) and actions[-1] == Exit(rc)


def test_a_scancel_is_told_at_once_and_the_stop_at_the_end_but_a_routine_requeue_only_as_requeue():
    st, actions = walk(*STARTED, SignalArrived("TERM"), SlurmSaid("RUNNING", "None"))
    assert told(actions) == [("cancelled", {"cause": "scancel", "requeued": "no", "restarts": "1"})]
    _, actions = walk(RunExited(75), state=st)
    assert told(actions) == [("job_stopped", {"cause": "scancel", "requeued": "no", "restarts": "1"})]
    _, actions = walk(*STARTED, SignalArrived("USR1"), RunExited(75))
    assert [e for e, _ in told(actions)] == ["requeue"]  # told only to a --notify-on requeue (core.notify)


def test_nodes_left_behind_or_replaced_are_told_once_per_decision():
    _, actions = walk(*STARTED, RunExited(77), NodesSaid("shrink", "n1", "n2", "-"))
    assert told(actions) == [("nodes_left_behind", {"action": "shrink", "drop": "n2", "keep": "n1", "exclude": "-"})]
    _, actions = walk(*STARTED, RunExited(77), NodesSaid("requeue", "n1", "n2", "n2"))
    assert [e for e, _ in told(actions)] == ["nodes_left_behind", "requeue"]
    _, actions = walk(*SPARE_START, RunExited(77), NodesSaid("replace", "n1,n3", "n2", "n2", "n1,n3", "-", "n2:n3"))
    assert told(actions) == [("replaced", {"action": "replace", "drop": "n2", "keep": "n1,n3", "exclude": "n2", "replaced": "n2:n3"})]
    for quiet in (NodesSaid("continue", "n1,n2"), NodesSaid("check", "n1,n3", "n2", "n2", "n1,n3", "n3")):
        _, actions = walk(*SPARE_START, RunExited(77), quiet)
        assert told(actions) == []  # nothing left behind yet
    _, actions = walk(*STARTED)
    assert told(actions) == []  # a start is not told
