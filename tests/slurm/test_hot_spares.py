"""Hot spares on a real SLURM cluster (.ci/slurm-up: three fake nodes n1-n3).

``ckpt submit --nodes 2 --spares 1`` allocates all three nodes and trains on n1, n2; n3 stands by.
The reference recipe's ``--fail-on-node n2`` makes n2's rank fail a few steps into every start (a
lasting hardware fault): after two failures in a row the next round runs on n1, n3 (n2 given back
with scontrol update NodeList), the same world size, so every step equals the uninterrupted
two-rank run bit for bit; a requeue afterwards never trains on n2. A standby that fails its
pre-flight check (``--node-check``) is left behind too, and the job shrinks instead.
"""

from __future__ import annotations

import pytest

from ckpt_tool.core.node_ledger import fold_health
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.supervise.run_dir import read_events

from ..conftest import STEPS
from .test_submit_chain import Job, assert_identical, sh

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ONE_SPARE = ("--nodes", "2", "--spares", "1", "--nproc-per-node", "1", "--env", "OMP_NUM_THREADS=1")


def test_a_failing_node_is_replaced_by_the_standby_exactly_and_a_requeue_never_trains_on_it(slurm, reference_run, tmp_path, cancel_jobs):
    """n2 fails 7 steps into every start; the standby n3 takes its slot (world size 2 throughout);
    the time-limit warning (USR1) then requeues the job, which never runs a rank on n2 again."""
    job = Job(tmp_path, "--fail-on-node", "n2", "--fail-after-steps", "7", submit_opts=(*ONE_SPARE, "--min-nodes", "2"))
    cancel_jobs.append(job)
    job.wait_for(lambda: "round 1: starting ckpt run on 2 node(s) (n1,n3)" in job.output(), "the replacement", timeout=300)
    replaced_at = max(e["time"] for e in read_events(job.run_dir) if e["event"] == "replaced")
    job.wait_for_step(25)
    job.usr1()
    job.release_when_pending()
    job.wait_done(timeout=300)
    out = job.output()
    assert "round 0: starting ckpt run on 2 node(s) (n1,n2); standing by: n3" in out, out[-4000:]
    assert "replaced n2 with n3: going on with 2 node(s) (n1,n3)" in out and "restart=1" in out and "training finished" in out
    log = read_events(job.run_dir)
    assert [(e["node"], e["by"]) for e in log if e["event"] == "replaced"] == [("n2", "n3")]
    assert "2 failures in a row" in next(e["reason"] for e in log if e["event"] == "replaced")
    blamed = [e for e in log if e["event"] == "rank_exited" and e["cause"] == "crashed"]
    assert {e["node"] for e in blamed} == {"n2"} and len(blamed) == 2, blamed
    rounds = [(e["node"], e["time"]) for e in log if e["event"] == "start"]
    assert {n for n, _ in rounds if _ < replaced_at} == {"n1", "n2"}  # n3 ran no rank while it stood by
    assert {n for n, t in rounds if t > replaced_at} == {"n1", "n3"}, rounds  # n2 never again, requeue included
    assert [e["exclude"] for e in log if e["event"] == "requeue"] == ["n2"]
    ledger = fold_health(log)
    assert ledger.replaced == (("n2", "n3", ledger.replaced[0][2]),) and ledger.record("n2").left_behind
    assert ledger.record("n3").total == 0
    print("requeue after a replace: ExcNodeList took:", "ExcNodeList=n2" in sh("scontrol", "show", "job", job.id))
    health = job.status()["health"]
    assert health["left_behind"] == ["n2"] and health["replaced"][0]["node"] == "n2" and health["replaced"][0]["by"] == "n3"
    # the same world size all along: every step, re-run ones included, equal to the uninterrupted run bit for bit
    assert CheckpointStore(job.ckpt).read_manifest(STEPS).world_size == 2
    assert_identical(reference_run, job)


def test_a_standby_that_fails_its_node_check_is_left_behind_and_the_job_shrinks(slurm, tmp_path, cancel_jobs):
    check = 'echo "check on $SLURMD_NODENAME"; test "$SLURMD_NODENAME" != n3'
    opts = (*ONE_SPARE, "--min-nodes", "1", "--node-check", check, "--node-check-timeout", "60")
    job = Job(tmp_path, "--fail-on-node", "n2", "--fail-after-steps", "7", submit_opts=opts, steps=20)
    cancel_jobs.append(job)
    job.wait_done(timeout=300)
    out = job.output()
    assert "checking standby n3 before it takes a slot" in out and "node check on n3: failed (exit 1" in out, out[-4000:]
    assert "left n2,n3 behind: going on with 1 node(s) (n1)" in out and "training finished" in out, out[-4000:]
    log = read_events(job.run_dir)
    (checked,) = [e for e in log if e["event"] == "node_check"]
    assert (checked["node"], checked["result"], checked["detail"]) == ("n3", "failed", "check on n3")
    (left,) = [e for e in log if e["event"] == "nodes_left_behind"]
    assert left["action"] == "shrink" and left["drop"] == ["n2", "n3"] and "node check failed (check on n3)" in left["reason"]
    assert not [e for e in log if e["event"] == "replaced"]
    assert {e["node"] for e in log if e["event"] == "start"} == {"n1", "n2"}  # n3 never ran a rank
    assert CheckpointStore(job.ckpt).read_manifest(20).world_size == 1
