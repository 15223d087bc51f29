"""Figure 16: the same lasting node fault with a hot spare and without: the way back, the speed after it, goodput.

How: the one-machine SLURM cluster (``.ci/slurm-up``: three fake nodes n1-n3 on loopback) is
started when it does not answer. Three real jobs of the reference recipe (the same as figure 11's:
tiny_gpt, 60 steps, a save every 5), one after the other, as a user submits them::

    uninterrupted: ckpt submit --nodes 2 --nproc-per-node 1 ...
    spare:         ckpt submit --nodes 2 --spares 1 --min-nodes 2 ... -- ... --fail-on-node n2 --fail-after-steps 7
    shrink:        ckpt submit --nodes 2 --min-nodes 1 ...            -- ... --fail-on-node n2 --fail-after-steps 7

n2's rank fails 7 steps into every start (``RuntimeError: CUDA error: uncorrectable ECC error``,
injected). With the spare the next round runs on n1, n3 (world size 2, bit-identical); without,
on n1 alone (world size 1: one rank does both ranks' micro-batches, by accumulation).

From ``D/run/events.jsonl``: the first ``rank_exited`` of n2 (cause ``crashed``) -> the first
``resumed`` on the new node set, split as figure 11 splits it (``node_fault.analyse``). Steps per
second: before the fault, the uninterrupted job's (its ranks' first beat -> ``job_finished``, 60
steps); after the recovery, each faulty job's from that ``resumed`` (its checkpoint's step) to
``job_finished``. Both spans include the saves every 5 steps and the end of the job, alike. Goodput:
the uninterrupted job's ``job_start`` -> ``job_finished`` over each faulty job's (the same 60 steps).
"""

from __future__ import annotations

import common
from common import Result, Row, Stats
from node_fault import STEPS, analyse, first, run_job
from requeue_chain import cluster_down_if_idle, cluster_up

BASE = ("--nproc-per-node", "1", "--env", "OMP_NUM_THREADS=1", "--time", "20:00")
FAULT = ("--fail-on-node", "n2", "--fail-after-steps", "7")
JOBS = {
    "uninterrupted": ("--nodes", "2", *BASE),
    "spare": ("--nodes", "2", "--spares", "1", "--min-nodes", "2", *BASE),
    "shrink": ("--nodes", "2", "--min-nodes", "1", *BASE),
}


def rate_after(job: dict) -> float:
    """Steps per second from the first resumed step on the new node set to the job's end."""
    ev = job["events"]
    decided = first(ev, 0, "nodes_left_behind")
    resumed = next(e for e in ev if e["event"] == "resumed" and e["time"] >= decided)
    return (STEPS - int(resumed["step"])) / (first(ev, decided, "job_finished") - float(resumed["time"]))


def rate_uninterrupted(job: dict) -> float:
    ev = job["events"]
    return STEPS / (first(ev, 0, "job_finished") - first(ev, 0, "ranks_started"))


def sample(jobs: dict[str, dict]) -> dict[str, float]:
    """One trial's figures: each faulty job's segments (node_fault.analyse), rates and goodput."""
    out: dict[str, float] = {"rate_before": rate_uninterrupted(jobs["uninterrupted"])}
    for name in ("spare", "shrink"):
        for key, value in analyse(jobs[name], jobs["uninterrupted"], node="n2").items():
            out[f"{name}: {key}"] = value
        out[f"{name}: rate_after"] = rate_after(jobs[name])
        out[f"{name}: replaced"] = sum(1 for e in jobs[name]["events"] if e["event"] == "replaced")
    return out


def report(samples: list[dict[str, float]], cluster_note: str) -> Result:
    n = len(samples)
    result = Result("16", f"Hot spares (#33): the same lasting node fault with a spare and without (shrink), {n} run(s) of each")

    def stats(key: str) -> Stats:
        return Stats.of([s[key] for s in samples])

    spare, shrink = stats("spare: total"), stats("shrink: total")
    result.rows.append(Row("first failure on n2 -> first step trained after the replacement (n1, n3)", spare.fmt(2, "s")))
    result.rows.append(
        Row(
            "first failure on n2 -> first step trained after the shrink (n1)",
            shrink.fmt(2, "s"),
            "-",
            round(spare.median / shrink.median, 3),
        )
    )
    for key, label in [
        ("detection", "(1) detection: first failure -> round ended"),
        ("decision", "(2) decision: -> `ckpt nodes` said replace / shrink"),
        ("shrink", "(3) -> `scontrol update NodeList` done"),
        ("start", "(4) start: -> first beat of the ranks on the new nodes"),
        ("load", "(5) load: -> first resumed step"),
    ]:
        a, b = stats(f"spare: {key}"), stats(f"shrink: {key}")
        result.rows.append(Row(f"{label}: spare / shrink", f"{a.fmt(2, 's')} / {b.fmt(2, 's')}", "-", round(a.median / b.median, 3)))
    before = stats("rate_before")
    result.rows.append(Row("steps/s, the uninterrupted 2-node job (as before the fault)", before.fmt(2)))
    for name, what in (("spare", "after the replacement, on n1, n3"), ("shrink", "after the shrink, on n1 alone")):
        after = stats(f"{name}: rate_after")
        result.rows.append(Row(f"steps/s {what}", after.fmt(2), f"uninterrupted {before.fmt(2)}", round(after.median / before.median, 3)))
    clean = stats("spare: clean_wall")
    result.rows.append(Row("uninterrupted 2-node job, job_start -> job_finished", clean.fmt(2, "s")))
    for name in ("spare", "shrink"):
        wall, goodput = stats(f"{name}: faulty_wall"), stats(f"{name}: goodput")
        result.rows.append(Row(f"{name}: job_start -> job_finished", wall.fmt(2, "s")))
        result.rows.append(
            Row(f"goodput, {name}: uninterrupted / this job (same {STEPS} steps)", goodput.fmt(3), "-", round(goodput.median, 3))
        )
    result.notes += [
        "replacements recorded (spare, shrink): "
        + "; ".join(f"{int(s['spare: replaced'])}, {int(s['shrink: replaced'])}" for s in samples),
        "steps trained twice (spare; shrink): "
        + "; ".join(f"{int(s['spare: steps_retrained'])}; {int(s['shrink: steps_retrained'])}" for s in samples),
        "the way back is nearly the same either way: the ledger needs two failures in a row on n2 and the next round starts "
        "from the newest checkpoint; what the spare changes is the speed after it and the bit-identical resume",
        "one machine: the fake nodes share 2 cores, so two ranks do not run twice as fast as one; on real nodes the shrink's "
        "loss of speed is the lost node's share (here 1/2)",
        f"SLURM cluster: {cluster_note}",
    ]
    result.details = {"samples": samples}
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=1, help="runs of each of the three jobs (default 1)")
    args = parser.parse_args()
    was_running = cluster_up()
    samples: list[dict[str, float]] = []
    try:
        with common.scratch_dir(args.work_dir, "hot_spares") as work:
            for i in range(args.trials):
                jobs = {name: run_job(work / f"trial{i}-{name}", name != "uninterrupted", opts, FAULT) for name, opts in JOBS.items()}
                s = sample(jobs)
                samples.append(s)
                common.log(
                    f"trial {i + 1}/{args.trials}: first failure -> resumed: spare {s['spare: total']:.2f} s, shrink {s['shrink: total']:.2f} s; "
                    f"steps/s before {s['rate_before']:.2f}, after: spare {s['spare: rate_after']:.2f}, shrink {s['shrink: rate_after']:.2f}; "
                    f"goodput spare {s['spare: goodput']:.3f}, shrink {s['shrink: goodput']:.3f}"
                )
    finally:
        cluster_note = cluster_down_if_idle(was_running)
    report(samples, cluster_note).emit()


if __name__ == "__main__":
    main()
