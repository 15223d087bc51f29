"""A node that keeps failing, on a real SLURM cluster (.ci/slurm-up: three fake nodes n1-n3).

The reference recipe's ``--fail-on-node`` makes the ranks on one SLURM node fail a few steps
into every start (a lasting hardware fault). The job, submitted with ``--nodes 3 --min-nodes 2``,
must leave that node behind (scontrol update NodeList), resume on two nodes with the same global
batch, and train the same losses as an uninterrupted three-rank run; a requeue while shrunk must
keep the job off that node (ExcNodeList); a fault that moves between nodes or a bug that fails
everywhere must not cost a healthy node (nor, with a hot spare, use the standby).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ckpt_tool.core.node_ledger import fold_health
from ckpt_tool.recipes.launch import compare_runs, read_metrics
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.supervise.run_dir import read_events

from ..conftest import Recipe
from .test_submit_chain import Job, sh

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 30
# no dropout: the losses of a run resharded onto fewer ranks match within float rounding
BATCH = ("--micro-batch", "4", "--grad-accum", "1", "--dropout", "0")  # global batch 12 on 3 ranks
THREE_NODES = ("--nodes", "3", "--min-nodes", "2", "--nproc-per-node", "1", "--env", "OMP_NUM_THREADS=1")
RTOL = 1e-4
# the events that tell how a failure was handled: in place by torchrun, or by a new round
TRAIL = ("start", "rank_exited", "restarted", "failed", "finished", "failure_counted", "crash_loop", "stop_deadline", "fatal")


@pytest.fixture(scope="module")
def reference_3(tmp_path_factory) -> Recipe:
    """An uninterrupted run at world size 3 (one machine, three ranks): the losses to match."""
    recipe = Recipe(tmp_path_factory.mktemp("reference3"), nproc=3, steps=STEPS, extra=BATCH)
    assert recipe.run() == 0, recipe.log.read_text()[-4000:]
    return recipe


def assert_losses_match(reference: Recipe, job: Job) -> None:
    ref = {m.step: m.loss for m in reference.metrics_lines()}
    seen = read_metrics(job.metrics)
    assert {m.step for m in seen} == set(ref), "every step trained"
    bad = [(m.step, m.loss, ref[m.step]) for m in seen if abs(m.loss - ref[m.step]) > RTOL * abs(ref[m.step])]
    assert not bad, bad[:5]


def events(job: Job) -> list[dict]:
    return read_events(job.run_dir)


def start_nodes(job: Job) -> list[str]:
    return [e["nodes"] for e in events(job) if e["event"] == "job_start"]


def test_a_node_that_keeps_failing_is_left_behind_and_a_requeue_never_trains_on_it(slurm, reference_3, tmp_path, cancel_jobs):
    """One job: n3 fails 7 steps into every start; the job leaves it behind and goes on with 2
    nodes; the time-limit warning (USR1) while shrunk requeues it, and the requeued job never
    trains on n3; every step's loss matches the uninterrupted 3-rank run."""
    job = Job(tmp_path, "--fail-on-node", "n3", "--fail-after-steps", "7", *BATCH, submit_opts=THREE_NODES, steps=STEPS)
    cancel_jobs.append(job)
    job.wait_for(lambda: "round 1: starting ckpt run on 2 node(s)" in job.output(), "shrink", timeout=300)
    job.usr1()  # the time-limit warning while shrunk: checkpoint, requeue
    job.release_when_pending()
    job.wait_done(timeout=300)
    out = job.output()
    assert "left n3 behind" in out and "restart=1" in out and "training finished" in out, out[-4000:]
    log = events(job)
    starts = [e for e in log if e["event"] == "job_start"]
    assert [e["nodes"] for e in starts][0] == "n[1-3]" and len(starts) == 2

    # the fault was n3's: two crashes of its own, its peers' collectives failed after them
    blamed = [e for e in log if e["event"] == "rank_exited" and e["cause"] == "crashed"]
    assert {e["node"] for e in blamed} == {"n3"} and len(blamed) == 2, blamed
    assert all("ECC" in e["reason"] for e in blamed)
    left = [e for e in log if e["event"] == "nodes_left_behind"]
    assert (left[0]["action"], left[0]["drop"], left[0]["keep"]) == ("shrink", ["n3"], ["n1", "n2"])
    assert all(e["drop"] == ["n3"] for e in left)
    assert [e["num_nodes"] for e in log if e["event"] == "shrunk"][0] == "2"
    ledger = fold_health(log)
    assert ledger.record("n3").in_a_row == 2 and ledger.record("n3").left_behind
    assert ledger.record("n1").total == 0 and ledger.record("n2").total == 0
    assert job.status()["health"]["left_behind"] == ["n3"]

    # the requeue kept excluding n3: SLURM kept it off (ExcNodeList took while the job was
    # pending) or the new start gave it back before training
    assert [e["exclude"] for e in log if e["event"] == "requeue"] == ["n3"]
    rounds = [(e["round"], e["node"]) for e in log if e["event"] == "start"]
    assert {node for rnd, node in rounds if rnd != rounds[0][0]} == {"n1", "n2"}, rounds
    excluded_by_slurm = "ExcNodeList=n3" in sh("scontrol", "show", "job", job.id)
    dropped_at_start = [e for e in log if e["event"] == "shrunk" and e["time"] > starts[1]["time"]]
    assert excluded_by_slurm or [e["dropped"] for e in dropped_at_start] == ["n3"], dropped_at_start
    print(f"requeue while shrunk: ExcNodeList took: {excluded_by_slurm}; given back at the start: {bool(dropped_at_start)}")

    # the same global batch on 2 nodes, and the same losses
    final = CheckpointStore(job.ckpt).read_manifest(STEPS)
    assert final.world_size == 2 and final.batch is not None
    assert (final.batch.micro_batch, final.batch.grad_accum, final.batch.global_batch) == (3, 2, 12)
    assert_losses_match(reference_3, job)


def test_a_fault_that_moves_between_nodes_costs_no_node(slurm, reference_3, tmp_path, cancel_jobs):
    """n1 fails, then n2: neither twice in a row (--suspect-after 2). Each crash is restarted
    inside the allocation (no requeue) and the run is bit-identical to the uninterrupted one."""
    job = Job(tmp_path, "--fail-on-node", "n1,n2", "--fail-after-steps", "7", *BATCH, submit_opts=THREE_NODES, steps=STEPS)
    cancel_jobs.append(job)
    job.wait_done(timeout=420)
    out = job.output()
    assert "training finished" in out, out[-4000:]
    log = events(job)
    assert not [e for e in log if e["event"] in ("nodes_left_behind", "shrunk", "round_ended", "requeue")], out[-3000:]
    restarts = {(e["node"], e["attempt"]) for e in log if e["event"] == "restarted"}  # each node's ckpt run notes it
    # torchrun restarted the group in place; if not, say how each failure was handled instead
    trail = [(e["event"], e.get("node"), e.get("round"), e.get("cause") or e.get("exit_code")) for e in log if e["event"] in TRAIL]
    assert {attempt for _, attempt in restarts} == {1, 2} and {n for n, _ in restarts} == {"n1", "n2", "n3"}, (trail, out[-3000:])
    assert "restart=1" not in out  # no requeue
    ledger = fold_health(log)
    assert [(r.node, r.total, r.in_a_row) for r in ledger.nodes] == [("n1", 1, 0), ("n2", 1, 1), ("n3", 0, 0)]
    assert CheckpointStore(job.ckpt).read_manifest(STEPS).world_size == 3
    # the same world size as the reference: every step, re-run ones included, equal bit for bit
    comparison = compare_runs(reference_3.metrics_lines(), read_metrics(job.metrics))
    assert comparison.identical and comparison.steps_compared == STEPS, comparison.mismatches[:3]


def test_a_bug_that_fails_everywhere_stops_the_job_without_leaving_nodes_behind_or_using_the_spare(slurm, tmp_path, cancel_jobs):
    """With a hot spare (n3 stands by): a bug fails every rank, so nobody is replaced, the standby
    never runs a rank, and the crash-loop breaker stops the job."""
    spare = ("--nodes", "2", "--spares", "1", "--min-nodes", "1", "--nproc-per-node", "1", "--env", "OMP_NUM_THREADS=1")
    job = Job(tmp_path, "--bug-at-step", "12", *BATCH, submit_opts=spare, steps=STEPS)
    cancel_jobs.append(job)
    job.wait_done(timeout=420)
    out = job.output()
    assert "crash loop" in json.dumps(events(job)) and "not a node's fault" in out, out[-4000:]
    assert "the failure is not one node's" in out and "standing by: n3" in out
    log = events(job)
    assert not [e for e in log if e["event"] in ("nodes_left_behind", "replaced", "shrunk", "requeue")]
    assert {e["node"] for e in log if e["event"] == "start"} == {"n1", "n2"}  # the spare untouched
    assert [e["exit_code"] for e in log if e["event"] == "job_failed"] == ["76"]
    ledger = fold_health(log)
    assert ledger.attributed == 0 and ledger.unattributed >= 2 and not ledger.suspects()
    assert subprocess.run(["squeue", "-h", "-j", job.id], capture_output=True, text=True).stdout.strip() == ""


def node_agents() -> dict[str, list]:
    """Each fake node's `ckpt run` and everything below it (torchrun agent, ranks)."""
    import psutil

    out: dict[str, list] = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "ckpt_tool.cli.main run" in " ".join(p.info["cmdline"] or []):
                out[p.environ()["SLURMD_NODENAME"]] = [p, *p.children(recursive=True)]
        except (psutil.Error, KeyError):
            continue
    return out


def hosts_the_rendezvous(procs: list, port: int) -> bool:
    """On a real cluster the rendezvous store lives on the first node; here every fake node has
    the endpoint's address, and whichever agent binds the port first hosts it."""
    import psutil

    for p in procs:
        try:
            if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp")):
                return True
        except psutil.Error:
            continue
    return False


def kill_a_node(job: Job) -> str:
    """SIGKILL the `ckpt run` of one node that does not host the rendezvous, with its torchrun
    agent and ranks: as if that node had died. Returns the node's name."""
    import re

    port = int(re.search(r"rendezvous [^:]+:(\d+)", job.output()).group(1))
    agents = node_agents()
    node = next(n for n in ("n3", "n2") if n in agents and not hosts_the_rendezvous(agents[n], port))
    for p in agents[node]:
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    return node


def test_a_node_lost_whole_is_left_out_by_the_elastic_rendezvous_in_the_same_round(slurm, reference_3, tmp_path, cancel_jobs):
    job = Job(tmp_path, *BATCH, submit_opts=THREE_NODES, steps=STEPS)
    cancel_jobs.append(job)
    job.wait_for_step(12)
    lost = kill_a_node(job)
    job.wait_done(timeout=300)
    out = job.output()
    assert "training finished" in out, out[-4000:]
    log = events(job)
    assert len({e["round"] for e in log if e["event"] == "start"}) == 1, "the same round went on"
    assert not [e for e in log if e["event"] in ("nodes_left_behind", "shrunk", "round_ended")]
    resumed = [e for e in log if e["event"] == "resumed"]
    assert {e["node"] for e in resumed} == {"n1", "n2", "n3"} - {lost}
    store = CheckpointStore(job.ckpt)
    assert store.read_manifest(STEPS).world_size == 2 and store.read_manifest(STEPS).batch.global_batch == 12
    assert_losses_match(reference_3, job)
