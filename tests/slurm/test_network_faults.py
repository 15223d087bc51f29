"""Faults of the network, injected at the network: the namespaced cluster (.ci/slurm-up with
CKPT_SLURM_NET=netns) gives each fake node its own namespace, address (10.77.0.X) and link
(the veth ckpt-nX on the bridge ckptbr0). A node's link cut mid-step in a 3-node job hangs every
rank in the same collective; the watchdogs' reachability probes name the node cut off, the
ledger leaves it behind and the job finishes. A healthy run on that cluster names nobody."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ckpt_tool.supervise.run_dir import read_events

from .test_node_faults import BATCH, STEPS, THREE_NODES
from .test_submit_chain import Job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def netns(slurm):
    """The cluster's nodes have links of their own (else: skip, saying why); every link is up
    again after the test, whatever happened."""
    conf = Path("/etc/slurm/slurm.conf")
    if "# network: netns" not in (conf.read_text() if conf.exists() else "") or not Path("/var/run/netns/ckpt-n2").exists():
        pytest.skip("the SLURM test cluster runs on loopback (CKPT_SLURM_NET=loopback or no `ip netns`): no link to cut")
    yield
    for n in ("n1", "n2", "n3"):
        subprocess.run(["ip", "link", "set", f"ckpt-{n}", "up"], check=False)


def link(node: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", f"ckpt-{node}", state], check=True)


def test_a_cut_link_is_the_cut_nodes_hang_it_is_left_behind_and_the_job_finishes(netns, tmp_path, cancel_jobs):
    job = Job(tmp_path, *BATCH, "--save-every", "5", submit_opts=(*THREE_NODES, "--suspect-after", "1"), steps=STEPS)
    cancel_jobs.append(job)
    # After step 6, 3-4 steps before the save of step 10: a cut inside a save's collective is found
    # only at the checkpoint phase's timeout (600 s; CI once cut after step 8 and landed there).
    job.wait_for_step(6)
    link("n2", "down")  # mid-step: n2's gloo connections stall, its peers wait for it
    cut_at = time.time()
    try:
        job.wait_for(lambda: any(e["event"] == "hang_report" for e in read_events(job.run_dir)), "a hang report", timeout=120)
    finally:
        link("n2", "up")  # a flapping link: back once the hang is explained (srun's own traffic needs it)
    job.wait_done(timeout=400)
    out = job.output()
    assert "training finished" in out and "left n2 behind" in out, out[-4000:]
    log = read_events(job.run_dir)
    reports = [e for e in log if e["event"] == "hang_report"]
    assert reports and all(r["culprit_nodes"] == ["n2"] for r in reports), reports
    assert "n2 cannot be reached by its peers" in reports[0]["reason"], reports[0]
    assert reports[0]["summary"].startswith("rank 1 on n2, cut off (its peers cannot reach it), in "), reports[0]
    assert reports[0]["time"] - cut_at < 30, "explained within seconds of the cut"
    hung = [e for e in log if e["event"] == "hang" and e["culprit"]]
    assert {e["node"] for e in hung} == {"n2"}, hung  # the victims on n1 and n3 are not blamed
    hang_dir = Path(reports[0]["stacks"])
    assert {p.name for p in hang_dir.glob("rank_*.txt")} == {"rank_0.txt", "rank_1.txt", "rank_2.txt"}
    left = [e for e in log if e["event"] == "nodes_left_behind"]
    assert left and left[0]["drop"] == ["n2"], left
    # the job's ranks talked across the bridge, not loopback: each rank's node has its own address
    starts = [e for e in log if e["event"] == "job_start"]
    assert starts and starts[0]["nodes"] == "n[1-3]"


def test_a_healthy_run_on_the_namespaced_cluster_names_nobody(netns, tmp_path, cancel_jobs):
    job = Job(tmp_path, *BATCH, submit_opts=THREE_NODES, steps=STEPS)
    cancel_jobs.append(job)
    job.wait_done(timeout=300)
    assert "training finished" in job.output(), job.output()[-3000:]
    names = [e["event"] for e in read_events(job.run_dir)]
    assert not {"hang", "hang_report", "rank_exited", "straggler", "nodes_left_behind"} & set(names), names


def slow(node: str, rate: str) -> None:
    """``tc ... tbf`` on both ends of the node's link (this kernel has no netem)."""
    for prefix in ([], ["ip", "netns", "exec", f"ckpt-{node}"]):
        dev = "eth0" if prefix else f"ckpt-{node}"
        subprocess.run(
            [*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kb", "latency", "100ms"], check=True
        )


def unslow(node: str) -> None:
    for prefix in ([], ["ip", "netns", "exec", f"ckpt-{node}"]):
        subprocess.run([*prefix, "tc", "qdisc", "del", "dev", "eth0" if prefix else f"ckpt-{node}", "root"], check=False)


def test_a_rate_limited_node_is_a_straggler_of_the_network_not_a_hang(netns, tmp_path, cancel_jobs):
    slow("n2", "8mbit")
    try:
        # ~2.3 s a step on the slow link: 16 steps train ~37 s; the slow link is named after two link
        # checks (10 s apart) at ~23 s from the job's start (measured), the rest shows no hang
        job = Job(tmp_path, *BATCH, submit_opts=THREE_NODES, steps=16)
        cancel_jobs.append(job)
        job.wait_done(timeout=400)
    finally:
        unslow("n2")
    assert "training finished" in job.output(), job.output()[-3000:]
    log = read_events(job.run_dir)
    names = [e["event"] for e in log]
    assert not {"hang", "hang_report", "rank_exited"} & set(names), names
    [found] = [e for e in log if e["event"] == "slow_link"]
    assert found["node"] == "n2" and found["share"] < 0.25, found
    assert set(found["mb_s"]) == {"to n1", "to n3", "from n1", "from n3"} and set(found["others_mb_s"]) == {"n1->n3", "n3->n1"}, found
    assert not [e for e in log if e["event"] == "straggler"], "the ranks' compute is not slower: no rank is named"
