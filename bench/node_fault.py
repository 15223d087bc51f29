"""Figure 11: a node that keeps failing: first failure -> first resumed step on fewer nodes; goodput.

How: the one-machine SLURM cluster (``.ci/slurm-up``: three fake nodes n1-n3 on loopback) is
started when it does not answer. Each trial submits two real jobs of the reference recipe as a
user does, one after the other, alternating which goes first::

    ckpt submit --ckpt-dir D --nodes 3 --min-nodes 2 --nproc-per-node 1 --env OMP_NUM_THREADS=1 -- \\
        -m ckpt_tool.recipes.tiny_gpt --steps 60 --save-every 5 --micro-batch 4 --grad-accum 1 \\
        --dropout 0 --d-model 64 --n-layer 2 --corpus-tokens 60000 [--fail-on-node n3 --fail-after-steps 7]

The faulty job's ranks on n3 fail 7 steps into every start (``RuntimeError: CUDA error:
uncorrectable ECC error``, injected); the job must leave n3 behind and finish on two nodes.

Times are the wall-clock ``time`` of the events in ``D/run/events.jsonl``: the first
``rank_exited`` of n3 (cause ``crashed``) is the first failure; the segments of the way to the
first resumed step on the smaller allocation are
(1) detection: first failure -> ``round_ended`` (the in-place restart on three nodes, the second
failure on n3, the ledger: n3 suspect after 2 in a row), split at the ``restarted`` event of n3;
(2) decision: ``round_ended`` -> ``nodes_left_behind`` (every node's ``ckpt run`` ends, srun
returns, ``ckpt nodes``);
(3) shrink: -> ``shrunk`` (``scontrol update NodeList``, the resize script);
(4) start: -> the ranks' first beat on the two nodes (``ranks_started``: ``ckpt recover`` with the
reshard plan, srun, torchrun's rendezvous, interpreter and imports, process group, model);
(5) load: -> ``resumed`` (``resume()``: hash-checked load at world size 2, probe check, one step).
Goodput: the uninterrupted job's ``job_start`` -> ``job_finished`` over the faulty job's (the same
60 steps of useful work); the steps trained twice are counted from the metrics file.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats
from requeue_chain import cluster_down_if_idle, cluster_up, sh

from ckpt_tool.recipes.launch import ckpt_submit_command

STEPS = 60
RECIPE_ARGS = (
    *("--steps", str(STEPS), "--save-every", "5", "--micro-batch", "4", "--grad-accum", "1", "--dropout", "0"),
    *("--d-model", "64", "--n-layer", "2", "--corpus-tokens", "60000"),
)
FAULT_ARGS = ("--fail-on-node", "n3", "--fail-after-steps", "7")
SUBMIT_OPTS = ("--nodes", "3", "--min-nodes", "2", "--nproc-per-node", "1", "--env", "OMP_NUM_THREADS=1", "--time", "20:00")


def run_job(
    root: Path, faulty: bool, submit_opts: tuple[str, ...] = SUBMIT_OPTS, fault_args: tuple[str, ...] = FAULT_ARGS
) -> dict[str, Any]:
    """One real job of the recipe (``submit_opts`` to ckpt submit, ``fault_args`` when ``faulty``),
    waited for: its events, and the steps it trained (re-run ones included) and the distinct ones."""
    ckpt, metrics = root / "ckpt", root / "metrics.jsonl"
    args = ("--ckpt-dir", str(ckpt), "--metrics", str(metrics), *RECIPE_ARGS, *(fault_args if faulty else ()))
    proc = subprocess.run(ckpt_submit_command(ckpt, args, submit_opts), capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"ckpt submit failed: {proc.stderr[-1500:]}")
    job_id = proc.stdout.split()[0]
    deadline = time.monotonic() + 600
    while common.squeue_state(job_id) != "" and time.monotonic() < deadline:
        time.sleep(0.5)
    if common.squeue_state(job_id) != "":
        sh("scancel", job_id)
        raise RuntimeError(f"job {job_id} did not finish in 600 s")
    events = [json.loads(line) for line in (ckpt / "run" / "events.jsonl").read_text().splitlines() if line.strip()]
    if not any(e["event"] == "job_finished" for e in events):
        raise RuntimeError(f"job {job_id} did not finish: {(ckpt / 'run' / f'slurm-{job_id}.out').read_text()[-2000:]}")
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return {"job_id": job_id, "events": events, "steps_trained": len(lines), "distinct_steps": len({m["step"] for m in lines})}


def first(events: list[dict], after: float, event: str, **match: Any) -> float:
    for e in events:
        if e["event"] == event and e["time"] >= after and all(e.get(k) == v for k, v in match.items()):
            return float(e["time"])
    raise RuntimeError(f"no {event} {match} after {after}")


def analyse(faulty: dict[str, Any], clean: dict[str, Any], node: str = "n3") -> dict[str, float]:
    """The segments from the first failure on ``node`` to the first resumed step on the nodes the
    job went on with (after a shrink or a replacement: both give ``node`` back with scontrol), and the goodput."""
    ev = faulty["events"]
    t = {"start": first(ev, 0, "job_start")}
    t["fail1"] = first(ev, 0, "rank_exited", node=node, cause="crashed")
    t["restart"] = first(ev, t["fail1"], "restarted", node=node)
    t["fail2"] = first(ev, t["restart"], "rank_exited", node=node, cause="crashed")
    t["round_ended"] = first(ev, t["fail2"], "round_ended")
    t["decided"] = first(ev, t["round_ended"], "nodes_left_behind")
    t["shrunk"] = first(ev, t["decided"], "shrunk")
    t["ranks_started"] = first(ev, t["shrunk"], "ranks_started")
    t["resumed"] = first(ev, t["shrunk"], "resumed")
    t["finished"] = first(ev, t["resumed"], "job_finished")
    ce = clean["events"]
    clean_wall = first(ce, 0, "job_finished") - first(ce, 0, "job_start")
    return {
        "detection": t["round_ended"] - t["fail1"],
        "detection: first failure -> restart on 3 nodes": t["restart"] - t["fail1"],
        "detection: restart -> second failure": t["fail2"] - t["restart"],
        "detection: second failure -> round_ended": t["round_ended"] - t["fail2"],
        "decision": t["decided"] - t["round_ended"],
        "shrink": t["shrunk"] - t["decided"],
        "start": t["ranks_started"] - t["shrunk"],
        "load": t["resumed"] - t["ranks_started"],
        "total": t["resumed"] - t["fail1"],
        "faulty_wall": t["finished"] - t["start"],
        "clean_wall": clean_wall,
        "goodput": clean_wall / (t["finished"] - t["start"]),
        "steps_retrained": faulty["steps_trained"] - faulty["distinct_steps"],
    }


def report(samples: list[dict[str, float]], cluster_note: str) -> Result:
    n = len(samples)
    result = Result("11", f"A node that keeps failing: first failure -> first resumed step on 2 of 3 nodes, goodput ({n} trials)")

    def stats(key: str) -> Stats:
        return Stats.of([s[key] for s in samples])

    total = stats("total")
    result.rows.append(Row("first failure on n3 -> first resumed step on n1, n2 (total)", total.fmt(2, "s")))
    for key, label in [
        ("detection", "(1) detection: first failure -> round ended (restart, second failure, ledger)"),
        ("decision", "(2) decision: round ended -> `ckpt nodes` said shrink (all ckpt runs exit, srun returns)"),
        ("shrink", "(3) shrink: -> `scontrol update NodeList` done"),
        ("start", "(4) start: -> first beat of the ranks on 2 nodes (recover, srun, torchrun, imports, model)"),
        ("load", "(5) load: -> first resumed step (resume() at world size 2: load, hashes, probe, one step)"),
    ]:
        s = stats(key)
        result.rows.append(Row(label, s.fmt(2, "s"), f"total {total.fmt(2, 's')}", round(s.median / total.median, 3)))
    clean, faulty = stats("clean_wall"), stats("faulty_wall")
    result.rows.append(Row("uninterrupted 3-node job, job_start -> job_finished", clean.fmt(2, "s")))
    result.rows.append(Row("job with the failing node, job_start -> job_finished", faulty.fmt(2, "s")))
    goodput = stats("goodput")
    result.rows.append(Row("goodput: uninterrupted / with the failing node (same 60 steps)", goodput.fmt(3), "-", round(goodput.median, 3)))
    result.notes += [
        "detection split: " + "; ".join(f"{k.split(': ', 1)[1]} {stats(k).fmt(2, 's')}" for k in samples[0] if k.startswith("detection: ")),
        f"steps trained twice (work lost to the two failures): {', '.join(str(int(s['steps_retrained'])) for s in samples)}",
        "the second failure comes 7 steps into the restart (--fail-after-steps 7, saves every 5 steps); with --suspect-after 1 "
        "the first failure would end the round, at the price of leaving a node behind for a one-off fault",
        f"SLURM cluster: {cluster_note}",
    ]
    result.details = {"samples": samples, "median_total_s": statistics.median(s["total"] for s in samples)}
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=None, help="pairs of jobs (default 3; --quick 1)")
    args = parser.parse_args()
    trials = args.trials or (1 if args.quick else 3)
    was_running = cluster_up()
    samples: list[dict[str, float]] = []
    try:
        with common.scratch_dir(args.work_dir, "node_fault") as work:
            for i in range(trials):
                order = (True, False) if i % 2 == 0 else (False, True)
                jobs = {faulty: run_job(work / f"trial{i}-{'faulty' if faulty else 'clean'}", faulty) for faulty in order}
                sample = analyse(jobs[True], jobs[False])
                samples.append(sample)
                common.log(
                    f"trial {i + 1}/{trials}: first failure -> resumed on 2 nodes {sample['total']:.2f} s "
                    f"(detection {sample['detection']:.2f}, decision {sample['decision']:.2f}, shrink {sample['shrink']:.2f}, "
                    f"start {sample['start']:.2f}, load {sample['load']:.2f}); goodput {sample['goodput']:.3f}"
                )
    finally:
        cluster_note = cluster_down_if_idle(was_running)
    report(samples, cluster_note).emit()


if __name__ == "__main__":
    main()
