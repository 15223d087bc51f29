"""The job chain's driver (``ckpt job``, slurm/job.py) with SLURM faked at the subprocess
boundary, as submitit's mocked_slurm does: ``scontrol`` and ``srun`` are executables on a PATH
that holds nothing else (the real ones are hidden), which log their argv and answer from files;
the payload srun runs is a tiny Python that exits with a given code or waits for USR1. Real
signals go to the real ``ckpt job`` process at each step. No SLURM needed; the tier takes ~15 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

FAKE = textwrap.dedent(
    """\
    #!{python}
    import json, os, signal, sys, time
    from pathlib import Path
    fake = Path({fake!r})
    name = Path(sys.argv[0]).name
    with open(fake / "calls.jsonl", "a") as f:
        f.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
    args = sys.argv[1:]
    if name == "srun" and "bash" in args:  # a node check: run it here, as the node would
        import subprocess
        sys.exit(subprocess.run(["/bin/bash", *args[args.index("bash") + 1:]]).returncode)
    if name == "srun":
        plans = (fake / "srun_plan").read_text().split()
        n = len([l for l in (fake / "calls.jsonl").read_text().splitlines() if json.loads(l)[0] == "srun" and "bash" not in l])
        plan = plans[min(n, len(plans)) - 1]
        if plan.startswith("exit"):
            sys.exit(int(plan[4:]))
        if plan.startswith("gate"):  # exit N once the test says go
            (fake / "payload_ready").touch()
            while not (fake / "go").exists():
                time.sleep(0.02)
            sys.exit(int(plan[4:]))
        (fake / "payload_ready").touch()
        if plan == "late":  # ckpt run still starting up (imports): USR1 now would kill it
            time.sleep(1.5)
        if plan in ("wait", "late"):  # ckpt run with its handler: checkpoint (1 s) on USR1, exit 75
            signal.signal(signal.SIGUSR1, lambda *a: (time.sleep(1), (fake / "checkpointed").touch(), sys.exit(75)))
            run_dir, round_ = Path(args[args.index("--run-dir") + 1]), args[args.index("--rdzv-id") + 1]
            nodes = [a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")][0].split(",")
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "events.jsonl", "a") as f:  # each node's ckpt run says so once its handler is in
                for node in nodes:
                    f.write(json.dumps({{"time": time.time(), "event": "start", "node": node, "round": round_}}) + "\\n")
        if plan == "bare":  # a ckpt run that dies before its handler (an import error, a bad node)
            time.sleep(2)
            sys.exit(1)
        for _ in range(600):
            time.sleep(0.05)
        sys.exit(99)
    if args[:2] == ["show", "hostnames"]:
        print("\\n".join(args[2].split(",")))
    elif args[:2] == ["show", "node"]:
        print(f"NodeName={{args[2]}} Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName={{args[2]}}")
    elif args[:2] == ["show", "job"]:
        print(f"JobId={{args[-1]}} " + (fake / "job_state").read_text())
    elif args[:1] == ["requeue"]:
        os.kill(os.getppid(), signal.SIGTERM)  # SLURM TERMs the batch job ~20 ms after its requeue
        time.sleep(0.1)
    elif args[:1] == ["update"] and args[2].startswith("NodeList="):
        keep = args[2].split("=", 1)[1]
        Path(f"slurm_job_{{args[1].split('=')[1]}}_resize.sh").write_text(
            f'export SLURM_NODELIST="{{keep}}"\\nexport SLURM_JOB_NODELIST="{{keep}}"\\nexport SLURM_JOB_NUM_NODES={{len(keep.split(","))}}\\n'
        )
    elif args[:1] == ["update"] and args[2].startswith("ExcNodeList="):
        tries = fake / "exclude_tries"
        tries.write_text(str(int(tries.read_text() or 0) + 1) if tries.exists() else "1")
        sys.exit(0 if int(tries.read_text()) >= 3 else 1)  # "no longer pending" twice, then it takes
    """
)


class FakeSlurm:
    """A PATH with fake scontrol/srun, a checkpoint and run directory, and ``ckpt job`` started on it."""

    def __init__(self, tmp: Path, srun_plan: str = "exit0", job_state: str = "JobState=RUNNING Reason=None", scontrol: bool = True):
        self.tmp, self.fake, self.bin = tmp, tmp / "fake", tmp / "bin"
        self.fake.mkdir()
        self.bin.mkdir()
        self.ckpt_dir, self.run_dir = tmp / "ck", tmp / "run"
        (self.fake / "srun_plan").write_text(srun_plan)
        (self.fake / "job_state").write_text(job_state)
        for name in ("srun", *(["scontrol"] if scontrol else [])):
            path = self.bin / name
            path.write_text(FAKE.format(python=sys.executable, fake=str(self.fake)))
            path.chmod(0o755)
        self.proc: subprocess.Popen | None = None

    def start(self, *options: str, nodes: str = "n1,n2", restart: int = 1) -> FakeSlurm:
        env = {
            "PATH": str(self.bin),  # nothing else: the real scontrol/srun, if any, are hidden
            "HOME": str(self.tmp),
            "SLURM_JOB_ID": "41",
            "SLURM_JOB_NODELIST": nodes,
            "SLURM_JOB_NUM_NODES": str(len(nodes.split(","))),
            "SLURM_RESTART_COUNT": str(restart),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
        argv = [sys.executable, "-m", "ckpt_tool.cli.main", "job", "--ckpt-dir", str(self.ckpt_dir), "--run-dir", str(self.run_dir)]
        argv += ["--max-requeues", "3", *options, "--", "train.py", "--steps", "9"]
        self.out = open(self.tmp / "job.out", "w")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.out, stderr=subprocess.STDOUT, cwd=self.tmp)
        return self

    def output(self) -> str:
        return (self.tmp / "job.out").read_text()

    def wait_for(self, what, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while not what():
            assert self.proc is not None and self.proc.poll() is None, f"ckpt job ended ({self.proc.returncode}):\n{self.output()}"
            assert time.monotonic() < end, f"timed out waiting\n{self.output()}"
            time.sleep(0.02)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        self.out.close()
        return rc

    def calls(self, name: str) -> list[list[str]]:
        path = self.fake / "calls.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [row[1:] for row in rows if row[0] == name]

    def events(self) -> list[tuple[str, dict]]:
        path = self.run_dir / "events.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [(r.pop("event"), {k: v for k, v in r.items() if k != "time"}) for r in rows]

    def chain_events(self) -> list[str]:
        """The events the chain wrote (not ckpt recover's or ckpt nodes')."""
        ours = {"job_start", "requeue", "excluded", "max_requeues_reached", "requeue_failed", "job_stopped", "cancelled", "shrunk"}
        return [e for e, _ in self.events() if e in ours | {"job_finished", "job_failed"}]


@pytest.fixture
def fake(tmp_path):
    return lambda **kw: FakeSlurm(tmp_path, **kw)


def test_a_round_that_finishes_ends_the_job(fake):
    job = fake(srun_plan="exit0").start()
    assert job.wait() == 0
    assert job.chain_events() == ["job_start", "job_finished"]
    assert dict(job.events())["job_start"] == {"job_id": "41", "restarts": "1", "nodes": "n1,n2"}
    (srun,) = job.calls("srun")
    assert srun[:6] == ["--kill-on-bad-exit=0", "--ntasks-per-node=1", "--nodes=2", "--ntasks=2", "--nodelist=n1,n2", sys.executable]
    assert srun[srun.index("--rdzv-endpoint") + 1].startswith("127.0.0.1:") and srun[srun.index("--rdzv-id") + 1] == "41.1.0"
    assert srun[srun.index("--") + 1 :] == ["train.py", "--steps", "9"]
    out = job.output()
    assert "fresh start: no checkpoint in" in out  # ckpt recover ran, and printed as the command does
    assert "[ckpt job=41 restart=1 " in out and "] ready: trap installed" in out
    assert "round 0: starting ckpt run on 2 node(s) (n1,n2), rendezvous 127.0.0.1:" in out
    assert "] training finished" in out
    assert not job.calls("scontrol")[-1:] or job.calls("scontrol")[-1][0] != "requeue"


def test_usr1_checkpoints_requeues_and_ignores_the_requeues_own_term(fake):
    job = fake(srun_plan="wait").start()
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    job.signal(signal.SIGUSR1)
    assert job.wait() == 0
    assert (job.fake / "checkpointed").exists()  # USR1 was forwarded to the payload, which checkpointed
    assert ["requeue", "41"] in job.calls("scontrol")
    assert job.chain_events() == ["job_start", "requeue"]  # the TERM after the requeue: no cancelled
    assert dict(job.events())["requeue"] == {
        "restarts": "1",
        "exclude": "-",
        "reason": "stopped by USR1 (time-limit warning or scancel --signal=USR1) after a checkpoint",
    }
    out = job.output()
    assert "got USR1: asking ckpt run to checkpoint and stop" in out and "ckpt run exited with 75" in out
    assert "requeuing (restart 1 of at most 3)" in out


def test_scancel_term_is_recorded_at_once_and_the_job_is_not_requeued(fake):
    job = fake(srun_plan="wait").start()
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    job.signal(signal.SIGTERM)
    job.wait_for(lambda: "cancelled" in job.chain_events())  # before KillWait's SIGKILL: while the checkpoint is written
    assert not (job.fake / "checkpointed").exists()
    assert job.wait() == 0
    assert (job.fake / "checkpointed").exists()
    assert ["show", "job", "-o", "41"] in job.calls("scontrol")
    assert not any(call[0] == "requeue" for call in job.calls("scontrol"))
    assert job.chain_events() == ["job_start", "cancelled", "job_stopped"]
    assert dict(job.events())["job_stopped"] == {"cause": "scancel", "requeued": "no", "restarts": "1"}
    assert "TERM from scancel (not a time limit or preemption): checkpointing, then stopping; not requeuing" in job.output()


@pytest.mark.parametrize(
    "state, cause", [("JobState=TIMEOUT Reason=TimeLimit", "time-limit"), ("JobState=PREEMPTED Reason=None", "preemption")]
)
def test_a_term_from_slurm_itself_checkpoints_and_requeues(fake, state, cause):
    job = fake(srun_plan="wait", job_state=state).start()
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    job.signal(signal.SIGTERM)
    assert job.wait() == 0
    assert job.chain_events() == ["job_start", "requeue"]
    assert dict(job.events())["requeue"]["reason"] == f"stopped by TERM ({cause}) after a checkpoint"


def test_a_stop_held_for_a_ckpt_run_that_dies_before_its_handler_still_requeues(fake):
    job = fake(srun_plan="bare").start()
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    job.signal(signal.SIGUSR1)
    assert job.wait() == 0
    assert "ckpt run exited with 1" in job.output()  # it ended by itself; the stop was never sent, nor lost
    assert job.chain_events() == ["job_start", "requeue"]


def test_a_stop_that_comes_while_ckpt_run_starts_waits_for_its_handler(fake):
    """USR1 as a round starts (CI saw it: one node's ckpt run killed by it, the others left in
    the rendezvous for the init timeout): ckpt job holds it until every node's ckpt run has
    logged its start, so the round checkpoints and requeues instead of dying."""
    job = fake(srun_plan="late").start()
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    job.signal(signal.SIGUSR1)
    assert job.wait() == 0
    assert (job.fake / "checkpointed").exists()  # it got the stop after its handler, not before
    assert "ckpt run exited with 75" in job.output()
    assert job.chain_events() == ["job_start", "requeue"]


def test_recover_failing_starts_no_training(fake):
    job = fake()
    job.ckpt_dir.mkdir()
    (job.ckpt_dir / "notes.txt").write_text("not a checkpoint")
    assert job.start().wait() == 2
    assert "is not a checkpoint directory" in job.output()
    assert "ckpt recover failed (exit 2): not starting training" in job.output()
    assert job.calls("srun") == []


def test_no_scontrol_cannot_requeue_and_says_why(fake):
    job = fake(srun_plan="exit75", scontrol=False).start()
    assert job.wait() == 75
    assert job.chain_events() == ["job_start", "requeue_failed"]
    assert dict(job.events())["requeue_failed"] == {"reason": "no-scontrol"}
    assert "scontrol is not available here (a container without SLURM tools?): cannot requeue" in job.output()


def test_max_requeues_reached_stops_with_75(fake):
    job = fake(srun_plan="exit75").start(restart=3)
    assert job.wait() == 75
    assert dict(job.events())["max_requeues_reached"] == {"restarts": "3", "limit": "3"}
    assert job.calls("scontrol") and not any(call[0] == "requeue" for call in job.calls("scontrol"))


def suspect_events() -> list[dict]:
    """Events that blame n2 twice in a row while n1 was fine: ckpt nodes makes n2 suspect."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_node_ledger import exit_, start

    events = start("r", "n1", "n2")
    for attempt, t in ((0, 1.0), (1, 5.0)):
        events += [
            exit_("r", attempt, "n2", "crashed", t, reason="RuntimeError: CUDA error"),
            exit_("r", attempt, "n1", "peer_failure", t + 0.5),
        ]
    return events


def seed_suspect(job: FakeSlurm) -> None:
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in suspect_events()))


def test_a_suspect_node_at_the_start_is_left_behind_and_the_job_trains_on_the_healthy_one(fake):
    job = fake(srun_plan="exit0")
    seed_suspect(job)
    assert job.start("--min-nodes", "1").wait() == 0
    assert ["update", "JobId=41", "NodeList=n1"] in job.calls("scontrol")
    assert dict(job.events())["shrunk"] == {"dropped": "n2", "nodes": "n1", "num_nodes": "1"}
    (srun,) = job.calls("srun")
    assert "--nodes=1" in srun and srun[srun.index("--nnodes") + 1] == "1"  # the resize script's values reach the round
    assert "left n2 behind: going on with 1 node(s) (n1)" in job.output()
    assert job.chain_events() == ["job_start", "shrunk", "job_finished"]


def test_too_few_healthy_nodes_requeues_excluding_the_bad_one_retrying_until_it_takes(fake):
    job = fake(srun_plan="exit0")
    seed_suspect(job)
    assert job.start("--min-nodes", "2").wait() == 0
    assert job.calls("srun") == []
    assert dict(job.events())["requeue"] == {"restarts": "1", "exclude": "n2", "reason": "too few healthy nodes: need 2"}
    tries = [c for c in job.calls("scontrol") if c[:1] == ["update"] and c[2] == "ExcNodeList=n2"]
    assert len(tries) == 3  # refused twice (the job was not pending yet), then taken; the requeue's TERM killed none
    assert "got TERM" in job.output()  # the requeue's own TERM came meanwhile, and decided nothing:
    assert not any(call[:2] == ["show", "job"] for call in job.calls("scontrol"))  # no scancel check
    assert job.chain_events() == ["job_start", "requeue", "excluded"]


def test_a_failed_round_then_a_shrink_starts_the_next_round_on_fewer_nodes(fake):
    job = fake(srun_plan="gate77 exit0")
    job.start("--min-nodes", "1")
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    with open(job.run_dir / "events.jsonl", "a") as f:  # the round's failures, as the watchdog writes them
        f.write("".join(json.dumps(e) + "\n" for e in suspect_events()))
    (job.fake / "go").touch()
    assert job.wait() == 0
    first, second = job.calls("srun")
    assert "--nodes=2" in first and "--nodes=1" in second
    assert second[second.index("--rdzv-id") + 1] == "41.1.1"  # round 1
    assert job.chain_events() == ["job_start", "shrunk", "job_finished"]


def fail_round_on_n2(job: FakeSlurm) -> None:
    """Let the gated first round fail with n2 to blame, as the watchdogs record it."""
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    with open(job.run_dir / "events.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in suspect_events()))
    (job.fake / "go").touch()


def test_a_standby_checked_healthy_takes_the_failing_nodes_slot(fake):
    job = fake(srun_plan="gate77 exit0")
    job.start("--min-nodes", "2", "--train-nodes", "2", "--node-check", 'echo "healthy: $CKPT_CHECK_NODE"', nodes="n1,n2,n3")
    fail_round_on_n2(job)
    assert job.wait() == 0
    first, check, second = job.calls("srun")
    assert "--nodes=2" in first and "--nodelist=n1,n2" in first
    assert check[:4] == ["--nodes=1", "--ntasks=1", "--nodelist=n3", "--kill-on-bad-exit=1"]
    assert "--nodes=2" in second and "--nodelist=n1,n3" in second and second[second.index("--nnodes") + 1] == "2"
    assert ["update", "JobId=41", "NodeList=n1,n3"] in job.calls("scontrol")  # n2 given back
    events = job.events()
    checks = [f for e, f in events if e == "node_check"]
    assert [(c["node"], c["result"], c["exit_code"], c["detail"]) for c in checks] == [("n3", "passed", 0, "healthy: n3")]
    assert [f for e, f in events if e == "replaced"] == [
        {"node": "n2", "by": "n3", "reason": "2 failures in a row, last rank 0 (local 0) crashed: RuntimeError: CUDA error"}
    ]
    assert [f["active"] for e, f in events if e == "nodes_active"] == ["n1,n2", "n1,n3"]
    out = job.output()
    assert "round 0: starting ckpt run on 2 node(s) (n1,n2); standing by: n3" in out
    assert "checking standby n3 before it takes a slot" in out and "node check on n3: passed (exit 0" in out
    assert "replaced n2 with n3: going on with 2 node(s) (n1,n3)" in out
    assert job.chain_events() == ["job_start", "shrunk", "job_finished"]


def test_a_standby_that_fails_its_check_is_left_behind_and_the_job_shrinks(fake):
    job = fake(srun_plan="gate77 exit0")
    job.start("--min-nodes", "1", "--train-nodes", "2", "--node-check", "echo 'PCIe link down' >&2; exit 3", nodes="n1,n2,n3")
    fail_round_on_n2(job)
    assert job.wait() == 0
    first, _check, second = job.calls("srun")
    assert "--nodes=1" in second and "--nodelist=n1" in second
    assert ["update", "JobId=41", "NodeList=n1"] in job.calls("scontrol")
    events = job.events()
    assert [(f["node"], f["result"], f["exit_code"], f["detail"]) for e, f in events if e == "node_check"] == [
        ("n3", "failed", 3, "PCIe link down")
    ]
    (left,) = [f for e, f in events if e == "nodes_left_behind"]
    assert left["action"] == "shrink" and left["drop"] == ["n2", "n3"] and "node check failed (PCIe link down)" in left["reason"]
    assert not [e for e, _ in events if e == "replaced"]
    assert "node check on n3: failed (exit 3" in job.output()


def test_a_failed_round_that_no_node_is_to_blame_for_is_the_trainings_failure(fake):
    job = fake(srun_plan="exit76").start()
    assert job.wait() == 76
    assert dict(job.events())["job_failed"] == {"exit_code": "76"}
    assert "training failed (exit 76), not a node's fault: not requeuing (see ckpt status)" in job.output()


def test_ckpt_job_outside_a_batch_job_is_a_usage_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "job", "--ckpt-dir", str(tmp_path), "--", "train.py"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "SLURM_JOB_ID is not set" in proc.stderr and "ckpt submit" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_node_checks_detail_is_its_own_last_line_not_the_one_srun_adds():
    """CI saw srun's "Terminating StepId" after a failing check become its detail."""
    from ckpt_tool.slurm.job import check_detail

    said = "check on n3\nsrun: error: n3: task 0: Exited with exit code 1\nsrun: launch/slurm: _step_signal: Terminating StepId=8.1\n"
    assert check_detail(said) == "check on n3"
    assert check_detail("srun: error: Unable to create step for job 8: Invalid node name specified\n") == (
        "srun: error: Unable to create step for job 8: Invalid node name specified"
    )
    assert check_detail("") == "" and check_detail("x" * 300) == "x" * 200


# --------------------------------------------------------------------------- --notify: once per event of the job, never fatal


def told(job: FakeSlurm) -> list[dict]:
    """The JSON lines the --notify command (``/bin/cat >> told.jsonl``) got, in order."""
    path = job.tmp / "told.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def notify_into(job: FakeSlurm) -> tuple[str, ...]:
    return ("--notify", f"/bin/cat >> '{job.tmp / 'told.jsonl'}'")  # the fake PATH holds only scontrol and srun


def test_the_jobs_end_is_notified_once_with_its_payload(fake):
    job = fake(srun_plan="exit0")
    assert job.start(*notify_into(job)).wait() == 0
    (end,) = told(job)  # job_start is not told; the round's end once, not once per node
    assert {k: end[k] for k in ("event", "job_id", "restart", "ckpt_dir", "run_dir", "nodes")} == {
        "event": "job_finished",
        "job_id": "41",
        "restart": 1,
        "ckpt_dir": str(job.ckpt_dir),
        "run_dir": str(job.run_dir),
        "nodes": ["n1", "n2"],
    }
    assert end["message"] == f"job 41 finished: the training ended ({job.ckpt_dir})" and end["next"] == f"ckpt status {job.ckpt_dir}"
    assert "] notified job_finished (" in job.output()
    assert "notify_failed" not in [e for e, _ in job.events()]


@pytest.mark.parametrize("rc, reason", [(76, "crash_loop"), (78, "save_failed")])
def test_a_failed_job_is_told_why(fake, rc, reason):
    job = fake(srun_plan=f"exit{rc}")
    assert job.start(*notify_into(job)).wait() == rc
    assert [(t["event"], t["exit_code"], t["reason"]) for t in told(job)] == [("job_failed", str(rc), reason)]
    assert dict(job.events())["job_failed"] == {"exit_code": str(rc)}  # the event log keeps the catalog's fields


def test_a_scancel_is_told_at_once_and_again_at_the_jobs_end(fake):
    job = fake(srun_plan="wait")
    job.start(*notify_into(job))
    job.wait_for(lambda: (job.fake / "payload_ready").exists())
    job.signal(signal.SIGTERM)
    job.wait_for(lambda: [t["event"] for t in told(job)] == ["cancelled"])  # while the stop's checkpoint is written
    assert job.wait() == 0
    assert [(t["event"], t["cause"]) for t in told(job)] == [("cancelled", "scancel"), ("job_stopped", "scancel")]


def test_a_node_left_behind_is_told_with_its_lists(fake):
    job = fake(srun_plan="exit0")
    seed_suspect(job)
    assert job.start("--min-nodes", "1", *notify_into(job)).wait() == 0
    left, end = told(job)
    assert (left["event"], left["action"], left["drop"], left["keep"]) == ("nodes_left_behind", "shrink", ["n2"], ["n1"])
    assert left["message"] == "job 41 left n2 behind: going on with n1" and end["event"] == "job_finished"


def test_a_failing_notify_command_is_recorded_and_the_job_goes_on(fake):
    job = fake(srun_plan="exit0")
    assert job.start("--notify", "echo 'webhook down' >&2; exit 3").wait() == 0
    assert job.chain_events() == ["job_start", "job_finished"]
    failed = dict(job.events())["notify_failed"]
    assert {k: failed[k] for k in ("for_event", "exit_code", "detail")} == {
        "for_event": "job_finished",
        "exit_code": 3,
        "detail": "exit 3: webhook down",
    }
    assert "notify job_finished failed: exit 3: webhook down; the job goes on" in job.output()


def test_a_hanging_notify_command_is_killed_at_its_timeout_and_the_job_ends(fake):
    job = fake(srun_plan="exit0")
    started = time.monotonic()
    assert job.start("--notify", "/bin/sleep 100", "--notify-timeout", "1").wait(timeout=20) == 0
    assert time.monotonic() - started < 15
    failed = dict(job.events())["notify_failed"]
    assert (failed["for_event"], failed["exit_code"], failed["detail"]) == ("job_finished", None, "timed out after 1 s (killed)")
    assert 1 <= failed["seconds"] < 8


def test_a_routine_requeue_is_told_only_when_asked_for(fake):
    job = fake(srun_plan="exit75")
    assert job.start(*notify_into(job), "--notify-on", "requeue,job_failed").wait() == 0
    (requeued,) = told(job)
    assert (requeued["event"], requeued["restarts"], requeued["exclude"]) == ("requeue", "1", [])
    assert requeued["message"] == "job 41 requeued (restart 1): stopped by the training (asked) after a checkpoint"
