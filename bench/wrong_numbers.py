"""Figure 18: wrong numbers caught (#35): what the checks cost per step, and from a wrong value to training on after a replay.

(1) the metrics' cost per step. In this process: a rank's ``AnomalyWatch.observe`` of two values
(``loss``, ``grad_norm``) with the spike check armed (a full window of 50), and the record's
buffered line, as ``maybe_save(step, metrics=...)`` does it; the median of 20 blocks of 2,000
calls. Beside it, a small model's training step (an MLP of 4 x 1024 -> 1024, batch 64, forward,
backward, AdamW, one core: ~40 ms), the step figure 17 used. No collective is added: a finding
rides on the step's existing sync (one more float in it). Target: < 0.1% of that step.

(2) the replica check's cost. The device-side fingerprint of the replicated parameters (that
same MLP's 4.2 M parameters, 16.8 MB, as DDP replicates them) and the all-gather of every
rank's fingerprints over gloo, on 2 ranks under torchrun (``--gather``: the median of 20). It
runs before each save (and every ``replica_check_every`` steps when asked): per save, and
spread over a save interval of 100 steps.

(3) from a wrong value to training on. The reference recipe under ``ckpt run`` (2 CPU ranks,
gloo, FSDP2, ``--d-model 64 --n-layer 2 --corpus-tokens 60000``, 30 steps, a save every 10) with
a NaN in rank 1's gradient at step 17, once. The replay goes back to the newest checkpoint: the
shared tier's step 10 (7 steps to re-run), or with the fast tier (``--local-every 2``) its step 16
(1 step). Measured from the ``anomaly`` event to the ``anomaly_replayed`` verdict (training goes
on at the next step), split: the restart (anomaly -> ``resumed``) and the steps re-run. Every
trial must name rank 1 and end bit-identical to an uninterrupted run.

(4) the audit (``--audit-every 1``: every save first recomputes the interval before it, here 10
steps, and compares). Its cost per audited save: from the ``audit`` event to the ``audited``
verdict (a restart and the interval recomputed), and the whole run's wall time against the same
run without audits (30 steps, 3 audits), per audit. With audits on, each rank also fingerprints
its gradient and parameter shards every step: measured in this process on the MLP of (1) (two
device-side integer sums over its 4.2 M parameters and their gradients), against its step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from common import Result, Row, Stats

from ckpt_tool.core.anomaly import AnomalyPolicy
from ckpt_tool.recipes.launch import RecipeJob, compare_runs, read_metrics
from ckpt_tool.supervise.run_dir import read_events

CORRUPT_AT = 17


def mlp_step_s(steps: int = 20) -> float:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 1024)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def observe_s(blocks: int, calls: int) -> float:
    """Seconds per ``AnomalyWatch.observe`` of two values, the window full, the record on."""
    from ckpt_tool.training.anomaly_watch import AnomalyWatch

    with tempfile.TemporaryDirectory() as tmp:
        watch = AnomalyWatch(Path(tmp), 0, AnomalyPolicy(window=50))
        watch.start(None)
        step = 0
        for _ in range(60):  # fill the windows
            step += 1
            watch.observe(step, {"loss": 2.0 + 0.01 * (step % 7), "grad_norm": 0.5 + 0.001 * (step % 5)})
        per = []
        for _ in range(blocks):
            t0 = time.perf_counter()
            for _ in range(calls):
                step += 1
                watch.observe(step, {"loss": 2.0 + 0.01 * (step % 7), "grad_norm": 0.5 + 0.001 * (step % 5)})
            per.append((time.perf_counter() - t0) / calls)
        watch.close()
    return statistics.median(per)


def state_prints_s(steps: int = 20) -> float:
    """Seconds per step of ``StateFingerprints`` (the gradients' before the step, the parameters' after)."""
    import torch

    from ckpt_tool.training.replicas import StateFingerprints

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prints = StateFingerprints(model, optimizer)
    model(torch.randn(64, 1024)).square().mean().backward()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        prints._take_grads()  # what the optimizer's pre-step hook does
        prints.values()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def audit_trial(root: Path) -> dict[str, float]:
    """The recipe with every save audited, and the same without: wall times and each audit's span."""
    plain = RecipeJob(root / "plain", 30, 10)
    t0 = time.monotonic()
    if plain.start().wait(300) != 0:
        raise RuntimeError(f"the plain run failed; see {plain.log}")
    plain_s = time.monotonic() - t0
    audited = RecipeJob(root / "audited", 30, 10, ("--audit-every", "1"))
    t0 = time.monotonic()
    if audited.start().wait(600) != 0:
        raise RuntimeError(f"the audited run failed; see {audited.log}")
    audited_s = time.monotonic() - t0
    events = read_events(audited.run_dir)
    starts = [e["time"] for e in events if e["event"] == "audit" and e["action"] == "replay"]
    verdicts = [e for e in events if e["event"] == "anomaly_replayed"]
    if [v["verdict"] for v in verdicts] != ["audited"] * len(starts) or not starts:
        raise RuntimeError(f"the audits did not all pass: {[v.get('message') for v in verdicts]}")
    if compare_runs(read_metrics(plain.metrics), list({m.step: m for m in read_metrics(audited.metrics)}.values())).mismatches:
        raise RuntimeError("the audited run's trajectory differs from the plain run's")
    spans = [v["time"] - t for t, v in zip(starts, verdicts, strict=True)]
    return {
        "audits": float(len(starts)),
        "span": statistics.median(spans),
        "per_audit": (audited_s - plain_s) / len(starts),
        "plain_s": plain_s,
    }


GATHER_SCRIPT = """
import json, statistics, sys, time, torch, torch.distributed as dist
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.replicas import ReplicaCheck
dist.init_process_group("gloo"); torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]))
check, comm = ReplicaCheck(model, dist.get_world_size(), None), Comm(with_control=True)
fp, total = [], []
for i in range(23):
    comm.main_barrier(); t0 = time.perf_counter()
    mine = check.fingerprint(1, saving=True); t1 = time.perf_counter()
    found = check.compare(1, mine, comm); t2 = time.perf_counter()
    assert not found
    if i >= 3: fp.append(t1 - t0); total.append(t2 - t0)
if dist.get_rank() == 0:
    print(json.dumps({"fingerprint_s": statistics.median(fp), "check_s": statistics.median(total),
                      "params": sum(p.numel() for p in model.parameters())}))
comm.close(); dist.destroy_process_group()
"""


def replica_check_s(work: Path) -> dict[str, float]:
    script = work / "gather.py"
    script.write_text(GATHER_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the replica check probe failed: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def replay_trial(root: Path, fast_tier: bool, reference: list) -> dict[str, float]:
    extra = (
        "--corrupt-at-step",
        str(CORRUPT_AT),
        "--corrupt-rank",
        "1",
        *(("--local-every", "2", "--local-dir", str(root / "local")) if fast_tier else ()),
    )
    job = RecipeJob(root, 30, 10, extra)
    code = job.start().wait(300)
    if code != 0:
        raise RuntimeError(f"the run did not finish (exit {code}); see {job.log}")
    events = read_events(job.run_dir)
    [found] = [e for e in events if e["event"] == "anomaly"]
    [verdict] = [e for e in events if e["event"] == "anomaly_replayed"]
    [resumed] = [e for e in events if e["event"] == "resumed"]
    if verdict["verdict"] != "transient" or verdict["ranks"] != [1]:
        raise RuntimeError(f"wrong verdict: {verdict['message']}")
    newest = {m.step: m for m in read_metrics(job.metrics)}
    comparison = compare_runs(reference, [newest[s] for s in sorted(newest)])
    if not comparison.identical:
        raise RuntimeError(f"not bit-identical to the uninterrupted run: {comparison.mismatches[:2]}")
    return {
        "total": verdict["time"] - found["time"],
        "restart": resumed["time"] - found["time"],
        "rerun": verdict["time"] - resumed["time"],
        "from": float(resumed["checkpoint"]),
    }


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=3, help="replays of each tier (default 3; --quick 1)")
    args = parser.parse_args()
    trials = 1 if args.quick else args.trials
    step = mlp_step_s()
    per_observe = observe_s(5 if args.quick else 20, 2000)
    per_prints = state_prints_s()
    common.log(f"observe: {per_observe * 1e6:.1f} us per step = {per_observe / step * 100:.4f}% of a {step * 1000:.1f} ms step")
    with common.scratch_dir(args.work_dir, "wrong_numbers") as work:
        replica = replica_check_s(work)
        common.log(f"replica check: {replica['check_s'] * 1000:.2f} ms ({replica['params']} parameters)")
        ref_job = RecipeJob(work / "reference", 30, 10)
        if ref_job.start().wait(300) != 0:
            raise RuntimeError(f"the reference run failed; see {ref_job.log}")
        reference = read_metrics(ref_job.metrics)
        audit = audit_trial(work / "audit")
        common.log(f"audit: {audit['span']:.2f} s a save (restart + 10 steps), {audit['per_audit']:.2f} s of wall time each")
        samples: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for i in range(trials):
            for fast in (False, True):
                s = replay_trial(work / f"{'fast' if fast else 'shared'}{i}", fast, reference)
                samples[fast].append(s)
                common.log(
                    f"trial {i + 1}/{trials} {'fast tier' if fast else 'shared tier'}: replay from {s['from']:.0f}, {s['total']:.2f} s"
                )

    result = Result("18", "Wrong numbers caught (#35): the checks' cost per step; a wrong value -> training on after a replay")
    cost = per_observe / step
    result.rows.append(
        Row("metrics: observe 2 values (spike window of 50 full) + record, per step", f"{per_observe * 1e6:.1f} us",
            f"{step * 1000:.1f} ms MLP step (4 x 1024^2, batch 64, one core)", round(cost / 0.001, 3), "< 0.1% of a step", cost < 0.001)
    )  # fmt: skip
    result.rows.append(
        Row(
            f"replica check: fingerprint of {replica['params'] / 1e6:.1f} M replicated parameters",
            f"{replica['fingerprint_s'] * 1000:.2f} ms",
        )
    )
    per_save = replica["check_s"]
    result.rows.append(
        Row("replica check: fingerprint + all-gather over gloo, 2 ranks (before each save)", f"{per_save * 1000:.2f} ms",
            f"spread over 100 steps: {per_save / 100 / step * 100:.3f}% of the MLP step")
    )  # fmt: skip
    for fast, label in ((False, "shared tier (step 10: 7 steps re-run)"), (True, "fast tier (step 16: 1 step re-run)")):
        runs = samples[fast]
        st = Stats.of([s["total"] for s in runs])
        split = f"restart {Stats.of([s['restart'] for s in runs]).median:.2f} s, re-run {Stats.of([s['rerun'] for s in runs]).median:.2f} s"
        result.rows.append(Row(f"NaN at step {CORRUPT_AT} -> verdict, training on; replay from the {label}", st.fmt(2, "s"), split))
    result.rows.append(
        Row("audit on: each rank's gradient and parameter shards fingerprinted, per step", f"{per_prints * 1000:.2f} ms",
            f"{per_prints / step * 100:.2f}% of the MLP step")
    )  # fmt: skip
    result.rows.append(
        Row("audit of one save: audit -> audited verdict (a restart + 10 steps recomputed)", f"{audit['span']:.2f} s",
            f"the run's wall time with an audit at each of {audit['audits']:.0f} saves: +{audit['per_audit']:.2f} s an audit "
            f"(the 30-step run alone: {audit['plain_s']:.1f} s)")
    )  # fmt: skip
    result.notes.append(f"every replay named rank 1 and the run ended bit-identical to an uninterrupted one ({trials} trial(s) a tier)")
    result.notes.append("the audits all passed and the audited run's trajectory equals the plain run's")
    result.emit()


if __name__ == "__main__":
    main()
