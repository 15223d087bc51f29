"""Goodput under injected failures: `ckpt plan`'s model (Daly) against a real supervised run.

How: the reference recipe (``python -m ckpt_tool.recipes.tiny_gpt``, 2 CPU ranks, gloo, FSDP2,
``--d-model 64 --n-layer 2 --corpus-tokens 60000``, sync saves, default retention) runs under
``ckpt run --nproc-per-node 2 --max-restarts 50 --crash-loop 50``, each launch in a directory
and a session of its own. A thread of this script tails the metrics file (rank 0 writes one
flushed line per optimizer step, then calls ``maybe_save``) every 5 ms and stamps each line
with the wall clock. For each checkpoint interval K (steps; default 5, 20, 80; --quick 5, 20):

1. clean run (no failures), ``--save-every 5 --steps 70`` (--quick 40), just before the failure
   run so both see the same load on this shared machine: the step time T = median interval
   between consecutive metrics lines of steps that do not save, the checkpoint cost
   C = median interval after a saving step (the save is blocking: it runs between the line of
   step s and the compute of step s+1) - T. The first 10 steps are left out (warm-up).
2. failure run, ``--save-every K --steps S`` (S = 800; --quick 60): once step 1 is seen, a
   driver draws exponential inter-failure times with mean MTBF (default 20 s; --quick 10 s;
   seeded RNG, seed + K) and at each instant SIGKILLs one rank chosen at random among the live
   rank processes (ckpt run's descendants running the recipe, rank from RANK in their
   environment). If no rank process is alive at that instant (teardown / restart), the failure
   hits the first rank process that appears: Daly's model counts failures during restarts too.
   Injection stops once step S is seen. Wall = stamp of the first line of step S - stamp of the
   first line of step 1; measured goodput = (S - 1) x T / wall.
3. restart cost R per failure = (stamp of the first metrics line after the kill) - kill time
   - T: detection, torchrun's teardown and restart, imports, resume (DCP load, checks) and the
   first step's extra cost. Failures followed by another before any step are not used for R.
   The events of RUN/events.jsonl after each kill split it: rank_exited (detection),
   restarted, resumed (wall-clock ``time`` fields); medians shown.

Model: ``ckpt_tool.core.interval.goodput(tau = K x T, C, MTBF, R)``, R = median over that run's
failures (the median over all runs when a run has none). The model's goodput with the
realised failure rate (MTBF = injection window / failures) is shown too, since a few minutes
hold only a handful of failures. Target (chosen here): measured / predicted within 0.8-1.25 per
K, and the measured goodputs ordered across K as the predicted ones (the curve's shape).
Total time is capped by --budget (default 720 s): K values that would not fit are skipped.
"""

from __future__ import annotations

import random
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import common
from common import Result, Row

from ckpt_tool.recipes.launch import RecipeJob

WARM_STEPS = 10
CLEAN_SAVE_EVERY = 5
RATIO_LOW, RATIO_HIGH = 0.8, 1.25


class Job(RecipeJob):
    """``ckpt run --nproc-per-node 2 ... -- -m tiny_gpt ...`` in ``root``, each metrics line stamped as it appears."""

    def __init__(self, root: Path, steps: int, save_every: int, run_opts: tuple[str, ...] = ()) -> None:
        super().__init__(root, steps, save_every, run_opts=run_opts)
        self.tail = common.MetricsTail(self.metrics)

    def start(self, env: Any = None) -> Job:
        self.tail.start()
        super().start(env)
        return self

    def finish(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        finally:
            self.tail.stop()


# ----------------------------------------------------------------------------- measurements
def step_intervals(lines: list[tuple[int, float]], save_every: int) -> tuple[list[float], list[float]]:
    """(intervals after a non-saving step, intervals after a saving step), consecutive steps only,
    from the first occurrence of each step, after the warm-up."""
    first: dict[int, float] = {}
    for s, t in lines:
        first.setdefault(s, t)
    plain, saving = [], []
    for s in sorted(first):
        if s <= WARM_STEPS or s + 1 not in first:
            continue
        dt = first[s + 1] - first[s]
        (saving if save_every and s % save_every == 0 else plain).append(dt)
    return plain, saving


def clean_run(work: Path, steps: int, deadline: float) -> dict[str, Any]:
    job = Job(work, steps, CLEAN_SAVE_EVERY).start()
    rc = job.finish(deadline - time.time())
    if rc != 0:
        raise RuntimeError(f"clean run exited with {rc}: {job.log_tail()}")
    plain, saving = step_intervals(job.tail.snapshot(), CLEAN_SAVE_EVERY)
    step_s = statistics.median(plain)
    return {"step_s": step_s, "ckpt_s": max(0.0, statistics.median(saving) - step_s), "n_plain": len(plain), "n_saving": len(saving)}


def failure_run(work: Path, steps: int, save_every: int, mtbf_s: float, seed: int, deadline: float) -> dict[str, Any]:
    rnd = random.Random(seed)
    job = Job(work, steps, save_every, run_opts=("--max-restarts", "50", "--crash-loop", "50")).start()
    kills: list[dict[str, Any]] = []
    while job.tail.first(1) is None:
        if job.proc.poll() is not None or time.time() > deadline:
            job.finish(1)
            raise RuntimeError(f"failure run: no step 1 (rc {job.proc.returncode}): {job.log_tail()}")
        time.sleep(0.01)
    start = job.tail.first(1)
    next_failure = start + rnd.expovariate(1.0 / mtbf_s)
    timed_out = False
    while job.tail.first(steps) is None and job.proc.poll() is None:
        now = time.time()
        if now > deadline:
            timed_out = True
            break
        if now < next_failure:
            time.sleep(min(0.01, next_failure - now))
            continue
        ranks = job.ranks()
        if not ranks:
            time.sleep(0.005)  # between teardown and restart: the failure hits the first rank that appears
            continue
        rank = rnd.choice(sorted(ranks))
        try:
            killed_at = time.time()
            ranks[rank].send_signal(signal.SIGKILL)
        except Exception:  # noqa: BLE001 - the process went away between listing and signal
            continue
        kills.append({"time": killed_at, "scheduled": next_failure, "rank": rank, "late_s": round(killed_at - next_failure, 3)})
        common.log(f"  K={save_every}: failure {len(kills)} at +{killed_at - start:.1f} s, rank {rank}, step {job.tail.snapshot()[-1][0]}")
        next_failure += rnd.expovariate(1.0 / mtbf_s)
    end_line = job.tail.first(steps)
    rc = job.finish(10 if end_line is not None or timed_out else deadline - time.time())
    lines = job.tail.snapshot()
    end = job.tail.first(steps)
    events = job.events()
    if end is None:
        end = lines[-1][1] if lines else start
    last_step = max((s for s, _ in lines), default=0)
    return {
        "rc": rc,
        "timed_out": timed_out or end_line is None and job.tail.first(steps) is None,
        "start": start,
        "end": end,
        "last_step": last_step,
        "kills": kills,
        "lines": lines,
        "events": events,
    }


def restart_costs(run: dict[str, Any], step_s: float) -> tuple[list[float], dict[str, list[float]]]:
    """R per failure (kill -> first metrics line after it - one step) and the event split."""
    kills, lines, events = run["kills"], run["lines"], run["events"]
    costs: list[float] = []
    split: dict[str, list[float]] = {"detect": [], "exited_to_restarted": [], "restarted_to_resumed": [], "resumed_to_step": []}
    for i, k in enumerate(kills):
        t = k["time"]
        nxt = kills[i + 1]["time"] if i + 1 < len(kills) else float("inf")
        first_line = next((lt for _, lt in lines if lt > t), None)
        if first_line is None or first_line > nxt:
            continue  # another failure before any step: not a clean sample of R
        costs.append(first_line - t - step_s)
        after = [e for e in events if t <= e.get("time", 0) <= first_line]
        ev = {name: next((e["time"] for e in after if e["event"] == name), None) for name in ("rank_exited", "restarted", "resumed")}
        if ev["rank_exited"]:
            split["detect"].append(ev["rank_exited"] - t)
        if ev["rank_exited"] and ev["restarted"]:
            split["exited_to_restarted"].append(ev["restarted"] - ev["rank_exited"])
        if ev["restarted"] and ev["resumed"]:
            split["restarted_to_resumed"].append(ev["resumed"] - ev["restarted"])
        if ev["resumed"]:
            split["resumed_to_step"].append(first_line - ev["resumed"])
    return costs, split


def lost_steps(run: dict[str, Any]) -> int:
    """Steps computed more than once (re-executed after a failure)."""
    return len(run["lines"]) - len({s for s, _ in run["lines"]})


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


# ----------------------------------------------------------------------------- main
def measure(work: Path, ks: list[int], steps: int, clean_steps: int, mtbf_s: float, seed: int, budget_s: float) -> dict[str, Any]:
    t0 = time.time()
    hard_end = t0 + budget_s
    runs: dict[int, dict[str, Any]] = {}
    skipped: list[int] = []
    for i, k in enumerate(ks):
        left = hard_end - time.time()
        # a failure run needs about (S x T) / goodput; leave it at least a third of what remains
        if left < 90 if i == 0 else left < 120:
            skipped.append(k)
            common.log(f"K={k}: skipped, {left:.0f} s of the budget left")
            continue
        common.log(f"K={k}: clean run ({clean_steps} steps, save every {CLEAN_SAVE_EVERY})")
        clean = clean_run(work / f"clean_k{k}", clean_steps, hard_end)
        common.log(
            f"K={k}: T={clean['step_s'] * 1e3:.1f} ms, C={clean['ckpt_s'] * 1e3:.1f} ms; failure run ({steps} steps, MTBF {mtbf_s:g} s)"
        )
        run = failure_run(work / f"fail_k{k}", steps, k, mtbf_s, seed + k, hard_end)
        costs, split = restart_costs(run, clean["step_s"])
        wall = run["end"] - run["start"]
        progress = (steps if not run["timed_out"] else run["last_step"]) - 1
        runs[k] = {
            "clean": clean,
            "wall_s": wall,
            "progress_steps": progress,
            "timed_out": run["timed_out"],
            "rc": run["rc"],
            "failures": len(run["kills"]),
            "restart_costs": costs,
            "split": split,
            "lost_steps": lost_steps(run),
            "kills": [
                {key: (round(v - run["start"], 3) if key in ("time", "scheduled") else v) for key, v in kk.items()} for kk in run["kills"]
            ],
            "events": sorted({e["event"] for e in run["events"]}),
            "failed_events": [e for e in run["events"] if e["event"] in ("failed", "crash_loop", "hang")],
        }
        common.log(f"K={k}: wall {wall:.1f} s, {len(run['kills'])} failures, R median {med(costs)} s, rc {run['rc']}")
    return {"runs": runs, "skipped": skipped, "total_s": time.time() - t0}


def report(data: dict[str, Any], mtbf_s: float, steps: int) -> Result:
    from ckpt_tool.core.interval import goodput, plan_interval

    runs = data["runs"]
    result = Result("goodput-sim", f"Goodput under injected rank failures (MTBF {mtbf_s:g} s, {steps} steps) vs Daly's model")
    all_costs = [c for r in runs.values() for c in r["restart_costs"]]
    pooled_r = statistics.median(all_costs) if all_costs else 0.0
    measured, predicted = {}, {}
    for k, r in sorted(runs.items()):
        t, c = r["clean"]["step_s"], r["clean"]["ckpt_s"]
        rr = statistics.median(r["restart_costs"]) if r["restart_costs"] else pooled_r
        g_meas = r["progress_steps"] * t / r["wall_s"] if r["wall_s"] > 0 else 0.0
        g_pred = goodput(k * t, max(c, 1e-6), mtbf_s, rr)
        realised = r["wall_s"] / r["failures"] if r["failures"] else float("inf")
        g_real = goodput(k * t, max(c, 1e-6), realised, rr) if r["failures"] else k * t / (k * t + c)
        measured[k], predicted[k] = g_meas, g_pred
        ratio = g_meas / g_pred
        partial = " (PARTIAL: run cut at the budget)" if r["timed_out"] else ""
        result.rows.append(
            Row(
                f"goodput, K={k} (tau={k * t:.2f} s){partial}",
                f"{g_meas:.3f}",
                f"model {g_pred:.3f} (T={t * 1e3:.0f} ms, C={c * 1e3:.0f} ms, R={rr:.2f} s, M={mtbf_s:g} s)",
                round(ratio, 3),
                f"{RATIO_LOW:g}-{RATIO_HIGH:g}",
                RATIO_LOW <= ratio <= RATIO_HIGH,
            )
        )
        result.notes.append(
            f"K={k}: {r['failures']} failures in {r['wall_s']:.1f} s (realised MTBF {realised:.1f} s -> model {g_real:.3f}, ratio {g_meas / g_real:.3f}); "
            f"steps re-executed {r['lost_steps']}; R samples {len(r['restart_costs'])}: median {med(r['restart_costs'])} s "
            f"(detect {med(r['split']['detect'])}, exited->restarted {med(r['split']['exited_to_restarted'])}, restarted->resumed {med(r['split']['restarted_to_resumed'])}, "
            f"resumed->first step {med(r['split']['resumed_to_step'])} s); ckpt run exit {r['rc']}"
        )
    if len(measured) >= 2:
        order_m = sorted(measured, key=measured.get)
        order_p = sorted(predicted, key=predicted.get)
        result.rows.append(
            Row(
                "curve shape: K ordered by goodput",
                " < ".join(f"K={k}" for k in order_m),
                "model: " + " < ".join(f"K={k}" for k in order_p),
                None,
                "same order",
                order_m == order_p,
            )
        )
    if runs:
        ts = [r["clean"]["step_s"] for r in runs.values()]
        cs = [r["clean"]["ckpt_s"] for r in runs.values()]
        plan = plan_interval(max(statistics.median(cs), 1e-6), mtbf_s, pooled_r, statistics.median(ts))
        result.rows.append(Row("restart cost R (info)", f"{pooled_r:.2f} s", f"median of {len(all_costs)} failures"))
        result.rows.append(
            Row("checkpoint cost C (info)", f"{statistics.median(cs) * 1e3:.0f} ms", f"step time T {statistics.median(ts) * 1e3:.0f} ms")
        )
        result.notes.append(
            f"`ckpt plan` optimum for these C, M, R, T: Daly tau {plan.interval_s:.2f} s = {plan.interval_steps} steps, goodput {plan.goodput:.3f}"
        )
    if data["skipped"]:
        result.notes.append(f"skipped for the time budget: K={data['skipped']}")
    result.notes.append(f"total {data['total_s']:.0f} s")
    result.details = {"mtbf_s": mtbf_s, "steps": steps, "runs": {str(k): v for k, v in runs.items()}, "skipped": data["skipped"]}
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--k", type=int, nargs="+", default=None, help="checkpoint intervals in steps (default 5 20 80; --quick 5 20)")
    parser.add_argument("--steps", type=int, default=None, help="steps of each failure run (default 800; --quick 60)")
    parser.add_argument("--mtbf", type=float, default=None, help="mean seconds between injected failures (default 20; --quick 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--budget", type=float, default=720, help="seconds for the whole benchmark; K values that do not fit are skipped (default 720)"
    )
    args = parser.parse_args()
    ks = args.k or ([5, 20] if args.quick else [5, 20, 80])
    steps = args.steps or (60 if args.quick else 800)
    mtbf = args.mtbf or (10.0 if args.quick else 20.0)
    clean_steps = 40 if args.quick else 70
    with common.scratch_dir(args.work_dir, "goodput_sim") as work:
        data = measure(work, ks, steps, clean_steps, mtbf, args.seed, args.budget)
    report(data, mtbf, steps).emit()


if __name__ == "__main__":
    main()
