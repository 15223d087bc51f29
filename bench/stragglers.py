"""Figure 15: stragglers (#18). The measurements' cost on step time, the delay in steps before a
1.5x and a 3x slow rank is reported, and false positives over normal runs.

Everything runs the reference recipe under ``ckpt run`` as tests/integration/test_run_watchdog.py
launches it (2 CPU ranks, gloo, FSDP2, ``--d-model 64 --n-layer 2 --corpus-tokens 60000``; the
bench/watchdog.py ``Job``: each metrics line stamped as it appears). Default straggler policy
(threshold 0.75, rolling medians over at least 5 steps and 5 s of steps, 5 steps in a row, 3
warm-up steps).

(1a) cost, micro (judged): in this process, one step's rank-side work as ``maybe_save`` and
``heartbeat().phase("data")`` do it under ``ckpt run`` (timer enter/leave of the data phase,
arrive, synced with a 2-rank result, the timing taken and encoded for the beat), median of
batches of 1000 steps; the watchdog's side (``StragglerDetector.observe`` of one rank-step, in
another process than the ranks) and the peers' median of a 4096-rank job (the ranks' cost at
scale), for information. Reference: the recipe's median step time under ``ckpt run`` in (1b).
Target: < 1% of a step.

(1b) cost, end to end (information): steps/s of the recipe with ``--save-every 0`` under
``ckpt run`` with the measurement on (default) and off (``CKPT_STEP_TIMING=0``), alternating, 3
runs each (--quick 1), over the steps after the first 10; the ratio of the medians. On this
shared 2-core machine run-to-run noise is larger than 1% (the spread is shown), so (1a) judges.

(2) detection delay: rank R (0 and 1 alternately) computes ``--slow-ms`` more CPU time per step
from step 100 (``--slow-from-step``; the windows are full by then), where ``--slow-ms`` = (factor
- 1) x the ranks' median compute measured in (1b) (``rank_health`` of its runs), factor 1.5 and
3; 3 trials each (--quick 1), 170 steps, a save every 10. Delay = steps from the first slow step
to the one whose timing the ``straggler`` event reports, plus the one step its beat comes later.
Target: every trial within the stated bound (``StragglerPolicy.bound_steps(step_s)``: the steps
until slow steps alone fill the 5 s window, or 3 when 5 steps span it, then 4 more in a row, 1
for the beat; ``step_s`` the median interval of the trial's metrics lines once the rank is
slow), the slow rank named; the rank's measured ``slower_x`` is shown (the injected factor is of
CPU work; the measured one includes the noise).

(3) false positives: ``straggler``, ``gpu_idle`` and ``gpu_error`` events over normal runs
(target 0): per repetition (3, --quick 1) a plain run (300 steps, async saves every 5), a run with
slow sync saves (``--save-delay 1``, every 20) and a 10 s data stall of rank 0 at step 100 (200
steps), and a run whose rank 1 is SIGKILLed at step 150 (restart, resume; 300 steps): each long
enough for its ranks to be scored (windows full; shown); plus the non-slow rank of every (2)
trial.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats
from watchdog import Job, steps_per_s

from ckpt_tool.core.stragglers import StepTiming, StragglerDetector, StragglerPolicy
from ckpt_tool.supervise.rank_vitals import read_rank_health
from ckpt_tool.training.step_timing import StepTimer

SLOW_FROM = 100
POLICY = StragglerPolicy()
ALARMS = ("straggler", "gpu_idle", "gpu_error")


# ----------------------------------------------------------------------------- (1) cost
def micro(batches: int, per_batch: int = 1000) -> dict[str, Any]:
    timer = StepTimer(rank=0, world_size=2)
    timer.synced([])
    reduced = [0.05, 0.001, -1.0, 0.05, 0.001, -1.0]
    rank_side = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for step in range(per_batch):
            timer.enter("data")
            timer.leave("data")
            timer.arrive(step)
            timer.synced(reduced)
            json.dumps(timer.take().to_wire())  # type: ignore[union-attr]
        rank_side.append((time.perf_counter() - t0) / per_batch)
    watchdog_side = {}
    for step_s in (0.1, 0.01):  # a window of 50 steps, and of max_window (256)
        detector = StragglerDetector(POLICY)
        timing = StepTiming(1, step_s, step_s / 2, 0.001, {"data": 0.001}, {"compute": step_s / 2, "data": 0.001})
        for _ in range(POLICY.max_window + POLICY.warmup):
            detector.observe(0, timing)  # the window full: steady state
        t0 = time.perf_counter()
        for _ in range(per_batch * 5):
            detector.observe(0, timing)
        watchdog_side[step_s] = (time.perf_counter() - t0) / (per_batch * 5)
    big = StepTimer(rank=7, world_size=4096)
    wide = [0.05] * (4096 * 3)
    t0 = time.perf_counter()
    for _ in range(50):
        big.peers_median(wide)
    return {"rank_side_s": rank_side, "watchdog_side_s": watchdog_side, "peers_median_4096_s": (time.perf_counter() - t0) / 50}


def end_to_end(work: Path, steps: int, runs: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for i in range(runs):
        for kind in ("on", "off"):
            job = Job(work / f"e2e_{kind}_{i}", steps, 0)
            try:
                rc = job.start(env={"CKPT_STEP_TIMING": "1" if kind == "on" else "0"}).wait(timeout=300)
            finally:
                job.cleanup()
            if rc != 0:
                raise RuntimeError(f"{kind} run exited {rc}: {job.log_tail()}")
            rate, intervals = steps_per_s(job.tail.lines)
            ranks = read_rank_health(job.run_dir)
            if kind == "on" and not ranks:  # ranks are scored once their window (5 s of steps) is full
                raise RuntimeError(
                    f"{steps} steps at {rate:.1f} steps/s filled no rank's 5 s window: no rank health to read; run more steps"
                )
            out[kind].append({"steps_per_s": rate, "median_step_s": statistics.median(intervals), "ranks": ranks})
            common.log(f"(1b) run {i + 1}/{runs} timing {kind}: {rate:.2f} steps/s")
    return out


# ----------------------------------------------------------------------------- (2) detection
def detection_trial(work: Path, factor: float, compute_s: float, rank: int) -> dict[str, Any]:
    slow_ms = (factor - 1) * compute_s * 1e3
    extra = ("--slow-rank", str(rank), "--slow-ms", f"{slow_ms:.1f}", "--slow-from-step", str(SLOW_FROM))
    job = Job(work, 170, 10, extra=extra)
    try:
        rc = job.start().wait(timeout=300)
    finally:
        job.cleanup()
    events = [e for e in job.events() if e["event"] in ALARMS]
    mine = [e for e in events if e["event"] == "straggler" and e["rank"] == rank]
    first = mine[0] if mine else None
    slow_lines = [line for line in job.tail.lines if line[0] > SLOW_FROM + 1]
    slow_step_s = statistics.median(b[1] - a[1] for a, b in zip(slow_lines, slow_lines[1:], strict=False))
    return {
        "exit_code": rc,
        "slow_ms": slow_ms,
        "slow_step_s": slow_step_s,
        "bound_steps": POLICY.bound_steps(slow_step_s),
        "delay_steps": first["step"] - SLOW_FROM + 2 if first else None,
        "slower_x": first["slower_x"] if first else None,
        "score": first["score"] if first else None,
        "others": [e for e in events if e not in mine],
    }


# ----------------------------------------------------------------------------- (3) false positives
def normal_run(work: Path, kind: str) -> dict[str, Any]:
    if kind == "plain":
        job = Job(work, 300, 5, extra=("--async-save",))
        rc = job.start().wait(timeout=300)
    elif kind == "stall":
        job = Job(work, 200, 20, extra=("--save-delay", "1", "--data-stall-at-step", "100", "--data-stall-s", "10"))
        rc = job.start().wait(timeout=300)
    else:
        job = Job(work, 300, 5)
        job.start()
        job.wait_for_step(150)
        ranks = job.ranks()
        os.kill(ranks[max(ranks)].pid, signal.SIGKILL)
        rc = job.wait(timeout=300)
    job.cleanup()
    events = job.events()
    return {
        "kind": kind,
        "exit_code": rc,
        "alarms": [e for e in events if e["event"] in ALARMS],
        "restarted": sum(e["event"] == "restarted" for e in events),
        "scored_ranks": len(read_rank_health(job.run_dir)),  # the last attempt's ranks whose windows filled
    }


# ----------------------------------------------------------------------------- report
def report(
    m: dict[str, Any], e2e: dict[str, list[dict[str, Any]]], trials: dict[float, list[dict[str, Any]]], normal: list[dict[str, Any]]
) -> Result:
    step_s = statistics.median(r["median_step_s"] for r in e2e["on"])
    rank_side = Stats.of(m["rank_side_s"])
    rows = [
        Row(
            "(1a) rank-side measurement per step (timer, step-sync slots, beat encoding)",
            rank_side.scaled(1e6).fmt(1, "us"),
            f"recipe step under ckpt run {step_s * 1e3:.1f} ms",
            round(rank_side.median / step_s, 5),
            "< 1% of a step",
            rank_side.median / step_s < 0.01,
        ),
        Row(
            "(1a) watchdog side per rank-step (scores, another process), 0.1 s steps (50-step windows)",
            f"{m['watchdog_side_s'][0.1] * 1e6:.1f} us",
            "0.1 s step",
            round(m["watchdog_side_s"][0.1] / 0.1, 5),
        ),
        Row(
            "(1a) watchdog side per rank-step, 0.01 s steps (256-step windows, the most)",
            f"{m['watchdog_side_s'][0.01] * 1e6:.1f} us",
            "0.01 s step",
            round(m["watchdog_side_s"][0.01] / 0.01, 5),
        ),
        Row("(1a) peers' median of a 4096-rank job, per step (rank side at scale)", f"{m['peers_median_4096_s'] * 1e6:.0f} us"),
    ]
    on = Stats.of([r["steps_per_s"] for r in e2e["on"]])
    off = Stats.of([r["steps_per_s"] for r in e2e["off"]])
    rows.append(
        Row(
            "(1b) steps/s, measurement on vs off (CKPT_STEP_TIMING=0)",
            f"{on.fmt(2)} vs {off.fmt(2)}",
            "off",
            round(on.median / off.median, 3),
        )
    )
    for factor, ts in trials.items():
        delays = [t["delay_steps"] for t in ts]
        ok = all(t["delay_steps"] is not None and t["delay_steps"] <= t["bound_steps"] for t in ts)
        shown = ", ".join(
            f"{d if d is not None else 'missed'} of {t['bound_steps']} (slower_x {t['slower_x']}, step {t['slow_step_s'] * 1e3:.0f} ms)"
            for d, t in zip(delays, ts, strict=True)
        )
        rows.append(
            Row(
                f"(2) {factor:g}x slow rank: steps from the first slow step to the report",
                shown,
                f"{len(ts)} trials",
                None,
                "every trial within its bound",
                ok,
            )
        )
    false_pos = sum(len(r["alarms"]) for r in normal) + sum(len(t["others"]) for ts in trials.values() for t in ts)
    kinds = ", ".join(sorted({r["kind"] for r in normal}))
    rows.append(
        Row(
            "(3) false positives (straggler/gpu events) over normal runs",
            str(false_pos),
            f"{len(normal)} runs ({kinds}) + the other rank of {sum(len(ts) for ts in trials.values())} trials",
            None,
            "0",
            false_pos == 0 and all(r["exit_code"] == 0 for r in normal),
        )
    )
    compute = statistics.median(r["compute_s"] for run in e2e["on"] for r in run["ranks"])
    notes = [
        f"(2) the slow rank did (factor - 1) x {compute * 1e3:.1f} ms more CPU work a step (the ranks' median compute in (1b)); "
        "slower_x is what the watchdog measured (compute vs the peer's median, rolling medians)",
        "(3) "
        + "; ".join(
            f"{r['kind']}: exit {r['exit_code']}, {len(r['alarms'])} alarms, {r['restarted']} restarts, {r['scored_ranks']} ranks scored"
            for r in normal
        ),
        f"(1b) spread: on {on.fmt(2)}, off {off.fmt(2)} steps/s; step {step_s * 1e3:.1f} ms",
    ]
    return Result(
        "15",
        "Stragglers (#18): cost, detection delay, false positives",
        rows,
        notes,
        {"micro": m, "e2e": e2e, "trials": {str(k): v for k, v in trials.items()}, "normal": normal},
    )


def main() -> None:
    parser = common.base_parser(__doc__)
    args = parser.parse_args()
    runs = 1 if args.quick else 3
    with common.scratch_dir(args.work_dir, "stragglers") as work:
        m = micro(5 if args.quick else 20)
        common.log(f"(1a) rank side {statistics.median(m['rank_side_s']) * 1e6:.1f} us/step")
        e2e = end_to_end(work, 120 if args.quick else 150, runs)  # quick: still > 5 s of steps at ~12 steps/s
        compute = statistics.median(r["compute_s"] for run in e2e["on"] for r in run["ranks"])
        trials: dict[float, list[dict[str, Any]]] = {}
        for factor in (1.5, 3.0):
            trials[factor] = [detection_trial(work / f"slow_{factor}_{i}", factor, compute, i % 2) for i in range(runs)]
            common.log(f"(2) {factor}x: delays {[t['delay_steps'] for t in trials[factor]]}")
        normal = [normal_run(work / f"normal_{k}_{i}", k) for i in range(runs) for k in ("plain", "stall", "kill")]
        common.log(f"(3) alarms {[len(r['alarms']) for r in normal]}")
    report(m, e2e, trials, normal).emit()


if __name__ == "__main__":
    main()
