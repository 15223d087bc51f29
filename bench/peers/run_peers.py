"""The peers benchmark (``make bench-peers``): the same training (``workload``) under each framework,
the same faults injected from outside the processes, all frameworks interleaved in one run.

Frameworks (``frameworks()``): ``ours`` (``ckpt run`` / ``ckpt submit`` and ``ours_train.py``),
``plain`` (``torchrun --max-restarts`` and DCP checkpoints, ``plain_train.py``), ``nvrx``
(nvidia-resiliency-ext's ``ft_launcher`` with its heartbeat client, ``nvrx_train.py``), ``torchft``
(a lighthouse and two replica groups, ``torchft_launch.py``), ``lightning`` (``Trainer`` with
``SLURMEnvironment(auto_requeue=True)``, ``lightning_train.py`` and ``lightning.sbatch``), each
peer from the venv ``install.sh`` makes. A framework whose venv is missing is reported as not run,
with the reason; a figure that does not apply to one says why (``Launch.skips``).

Each fault trial launches the training in a directory and a session of its own (2 ranks, gloo,
CPU, ``OMP_NUM_THREADS=1``), waits until rank 0 logged step ``FAULT_AT`` (two checkpoints made),
then:

- crash: SIGKILL of rank 1 (its pid from its step log);
- hang: SIGSTOP of rank 1;
- usr1 (on the local SLURM cluster): the job submitted, then SLURM's time-limit warning sent on
  demand (``scancel --signal=USR1``, to the batch shell or the steps as the framework is set up
  for), the requeued job released at once; SLURM's scheduling delay is measured and left out.

Measured from outside (the step logs, ``workload.StepLog``, the processes, ``squeue``):
*detection* = the fault to the moment rank 0's process is gone (the framework tore the group
down); *back* = the fault to the first step rank 0's new process trained; *steps lost* = the
newest step trained before the fault (before the job stopped, for usr1) less the step before the
first one trained again. A trial is cut at ``CAP_S`` seconds: "never". Then the whole session
(the job) is killed.

Steady state, one run per framework per round without faults (``STEADY_STEPS`` steps): the median
interval between rank 0's steps that make no checkpoint (the framework's per-step cost, against
``plain``'s) and the median excess of a checkpoint step's interval over it (the time a checkpoint
blocks training).

Medians over ``--trials`` rounds (>= 5 for the table), min-max beside; each round runs every
framework once per fault kind, in a shuffled order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))  # bench/common.py: the benchmarks' shared helpers
import common

from ckpt_tool.supervise.processes import kill_tree

OURS_PY = REPO / ".venv" / "bin" / "python"
VENVS = Path(os.environ.get("PEERS_VENVS", HERE / ".venvs"))
FAULT_AT, STEPS, STEADY_STEPS, CAP_S = 25, 60, 80, 45.0
KINDS = ("crash", "hang", "usr1", "steady")
POLL_S = 0.005  # how often the moments measured (a process gone, a step logged) are looked for
SAVE_EVERY = 10  # workload.SAVE_EVERY (not imported here: workload loads torch and the model)


@dataclass
class Launch:
    """How to start one framework's training: the command for (ckpt dir, steps dir, steps), its
    environment additions, and why it cannot run here (None: it can); under SLURM, the command that
    submits it (its first word out is the job id), whether USR1 goes to the batch shell (else to
    the job's steps) and when the job is ready for it; ``skips``: a figure (or a whole fault kind)
    that does not apply to it -> why."""

    name: str
    command: Callable[[Path, Path, int], list[str]]
    missing: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    skips: dict[str, str] = field(default_factory=dict)
    submit: Callable[[Path, Path, int], list[str]] | None = None
    usr1_to_batch: bool = True
    ready: Callable[[Path, str], bool] = lambda work, job: True

    def runs(self, kind: str) -> bool:
        """Whether the fault kind (crash, hang, usr1, steady) applies to it."""
        return kind not in self.skips

    def skip(self, key: str) -> str | None:
        """Why figure ``key`` (``crash_back_s``...) does not apply (None: it does)."""
        return next((why for k, why in self.skips.items() if key == k or key.startswith(k + "_")), None)


def _python(venv: str) -> Path:
    return VENVS / venv / "bin" / "python"


def frameworks() -> list[Launch]:
    """Every framework, with the reason it cannot run when its venv is missing."""
    nvrx_py, torchft_py, lightning_py = _python("nvrx"), _python("torchft"), _python("lightning")
    no_venv = {
        p: f"no venv at {p.parent.parent}: run bash bench/peers/install.sh" for p in (nvrx_py, torchft_py, lightning_py) if not p.exists()
    }
    if not OURS_PY.exists():
        no_venv[OURS_PY] = f"no venv at {OURS_PY.parent.parent}: run make bench-peers (it makes the project's venv first)"
    no_requeue = "n/a: no SLURM requeue of its own"

    def train(script: str, c: Path, s: Path, n: int) -> list[str]:
        return [str(HERE / script), str(c), str(s), str(n)]

    return [
        Launch(
            "ours",
            lambda c, s, n: [
                str(OURS_PY),
                *"-m ckpt_tool.cli.main run --nproc-per-node 2 --ckpt-dir".split(),
                str(c),
                "--",
                *train("ours_train.py", c, s, n),
            ],
            submit=lambda c, s, n: [
                *[
                    str(OURS_PY),
                    *"-m ckpt_tool.cli.main submit --nproc-per-node 2 --time 20:00 --env OMP_NUM_THREADS=1 --ckpt-dir".split(),
                    str(c),
                ],
                *["--", *train("ours_train.py", c, s, n)],
            ],
            missing=no_venv.get(OURS_PY),
            ready=lambda work, job: "ready: trap installed" in _text(work / "ckpt" / "run" / f"slurm-{job}.out"),
        ),
        Launch(
            "plain",
            lambda c, s, n: [
                str(OURS_PY),
                *"-m torch.distributed.run --nproc-per-node 2 --max-restarts 3".split(),
                *train("plain_train.py", c, s, n),
            ],
            no_venv.get(OURS_PY),
            skips={"usr1": no_requeue},
        ),
        Launch(
            "nvrx",
            lambda c, s, n: [
                *[str(nvrx_py), "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", *NVRX_OPTIONS],
                *["--nproc-per-node", "2", "--max-restarts", "3", *train("nvrx_train.py", c, s, n)],
            ],
            no_venv.get(nvrx_py),
            skips={"usr1": no_requeue},
        ),
        Launch(
            "torchft",
            lambda c, s, n: [str(torchft_py), *train("torchft_launch.py", c, s, n)],
            no_venv.get(torchft_py),
            skips={
                "crash_detection_s": "n/a: survivors go on",
                "hang_detection_s": "n/a: survivors go on",
                "steady_blocked_s": "n/a: no checkpoints",
                "usr1": no_requeue,
            },
        ),
        Launch(
            "lightning",
            lambda c, s, n: [str(lightning_py), *train("lightning_train.py", c, s, n)],
            no_venv.get(lightning_py),
            skips={"crash": "n/a: restarts nothing (the job ends)", "hang": "n/a: restarts nothing (gloo's 30-min timeout)"},
            # Lightning's SLURM page: one srun task per rank, SIGUSR1 to the steps (--signal=SIGUSR1@90)
            submit=lambda c, s, n: [
                *[
                    "sbatch",
                    "--parsable",
                    f"--output={c.parent}/slurm-%j.out",
                    f"--export=ALL,LIGHTNING_PY={lightning_py},LIGHTNING_TRAIN={HERE / 'lightning_train.py'}",
                ],
                *[str(HERE / "lightning.sbatch"), str(c), str(s), str(n)],
            ],
            usr1_to_batch=False,
        ),
    ]


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# ft_launcher's timeouts, tuned as a careful user would for a 0.05 s step (its defaults, 2700 s and
# 3600 s, are for jobs whose first step takes minutes): the first heartbeat within 60 s of the start
# (torch import, rendezvous), then at most 5 s between two (ckpt run's step timeout here is 5 s too);
# checked every second; the NIC monitor off (no InfiniBand on this machine: it prints tracebacks).
NVRX_OPTIONS = ("--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "5",
                "--ft-workload-check-interval", "1", "--ft-enable-nic-monitor", "false")  # fmt: skip


def start(fw: Launch, work: Path, steps: int) -> subprocess.Popen:
    """Launch ``fw``'s training in ``work`` (its own session, output to ``work/log.txt``)."""
    work.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **fw.env}
    with open(work / "log.txt", "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            fw.command(work / "ckpt", work / "steps", steps),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
            env=env,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    """Kill the trial's whole tree (a frozen rank included; the launchers' workers sit in sessions of their own)."""
    kill_tree([proc.pid])
    proc.wait()


def fault_trial(fw: Launch, kind: str, work: Path) -> dict[str, Any]:
    """One fault of ``kind`` (crash, hang) injected into ``fw``'s training; what was measured."""
    proc = start(fw, work, STEPS)
    steps0, steps1 = work / "steps" / "rank_0.jsonl", work / "steps" / "rank_1.jsonl"
    try:
        if not common.poll_until(lambda: any(r["step"] >= FAULT_AT for r in common.read_jsonl(steps0)), 180, 0.02):
            return {"error": f"never reached step {FAULT_AT}: {(work / 'log.txt').read_text(errors='replace')[-600:]}"}
        time.sleep(random.uniform(0, 0.05))
        before0, before1 = common.read_jsonl(steps0), common.read_jsonl(steps1)
        victim, survivor = before1[-1]["pid"], before0[-1]["pid"]
        reached = max(r["step"] for r in before0)
        t_fault = time.time()
        os.kill(victim, signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
        gone = common.poll_until(
            lambda: not psutil.pid_exists(survivor) or psutil.Process(survivor).status() == psutil.STATUS_ZOMBIE, CAP_S, POLL_S
        )
        t_gone = time.time() if gone else None
        back = common.poll_until(
            lambda: going_again(common.read_jsonl(steps0), len(before0), survivor), max(0.0, CAP_S - (time.time() - t_fault)), POLL_S
        )
        rejoined = common.poll_until(
            lambda: next((r for r in common.read_jsonl(steps1)[len(before1) :] if r["pid"] != victim), None),
            max(0.0, CAP_S - (time.time() - t_fault)),
            POLL_S,
        )
        return {
            "detection_s": None if t_gone is None else t_gone - t_fault,
            "back_s": None if back is None else back["time"] - t_fault,
            "group_back_s": None if rejoined is None else rejoined["time"] - t_fault,
            "steps_lost": None if back is None else max(0, reached - (back["step"] - 1)),
        }
    finally:
        stop(proc)


FAULT_KEYS = ("detection_s", "back_s", "group_back_s", "steps_lost")
STALL_S = 1.0  # a survivor's pause longer than this between two steps: it waited for the others


def going_again(rows: list[dict[str, Any]], seen: int, survivor: int) -> dict[str, Any] | None:
    """Rank 0's first step after the fault that shows training going on again: one by a new process
    (the group was restarted), or the survivor's first step after a stall (torchft's smaller quorum);
    the survivor's step in flight at the fault is neither."""
    for i in range(max(seen, 1), len(rows)):
        r = rows[i]
        if r["pid"] != survivor or r["time"] - rows[i - 1]["time"] > STALL_S:
            return r
    return None


def steady_trial(fw: Launch, work: Path) -> dict[str, Any]:
    """One run without faults: the median step interval off checkpoints, a checkpoint's excess over it."""
    proc = start(fw, work, STEADY_STEPS)
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        stop(proc)
        return {"error": "did not finish in 300 s"}
    rows = common.read_jsonl(work / "steps" / "rank_0.jsonl")
    gaps = {b["step"]: b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False) if b["step"] == a["step"] + 1}
    # the save of step k is made before step k is logged (the gap ending at k); an async save's copy
    # overlaps step k+1 (the gap ending at k+1): a checkpoint's cost is both gaps' excess
    plain = [g for s, g in gaps.items() if s > 10 and s % SAVE_EVERY not in (0, 1)]
    saving = [gaps[k] + gaps[k + 1] for k in gaps if k > 10 and k % SAVE_EVERY == 0 and k + 1 in gaps]
    if not plain or not saving:
        return {"error": f"too few steps logged ({len(rows)})"}
    step_s = statistics.median(plain)
    if fw.skip("steady_blocked_s"):
        return {"step_s": step_s, "blocked_s": None}
    return {"step_s": step_s, "blocked_s": statistics.median(saving) - 2 * step_s}


USR1_STEPS = 400  # the job trains on after the resume until the trial cancels it


def slurm_missing() -> str | None:
    """Why the USR1 trials cannot run here (None: a SLURM cluster answers)."""
    return None if common.cluster_answers() else "no SLURM cluster answers `sinfo` here: start one with make slurm-up"


def usr1_trial(fw: Launch, work: Path) -> dict[str, Any]:
    """SLURM's time-limit warning: ``fw``'s job submitted, USR1 at step ``FAULT_AT`` (to the batch
    shell or the steps, as ``fw`` is set up for), the requeued job released at once
    (``scontrol update StartTime=now+1``: a requeued job otherwise waits ``cred_expire``); the
    scheduling delay (PENDING -> RUNNING) is measured and left out of *back*."""
    assert fw.submit is not None
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **fw.env}
    out = subprocess.run(
        fw.submit(work / "ckpt", work / "steps", USR1_STEPS), capture_output=True, text=True, cwd=work, env=env, timeout=60
    )
    if out.returncode != 0 or not out.stdout.strip():
        return {"error": f"submit failed ({out.returncode}): {out.stderr[-600:]}"}
    job = out.stdout.split()[0].split(";")[0]
    steps0 = work / "steps" / "rank_0.jsonl"
    try:
        if not common.poll_until(lambda: any(r["step"] >= FAULT_AT for r in common.read_jsonl(steps0)) and fw.ready(work, job), 180, 0.02):
            return {"error": f"job {job} never reached step {FAULT_AT} (state {common.squeue_state(job)!r})"}
        old = common.read_jsonl(steps0)[-1]["pid"]
        t_fault = time.time()
        subprocess.run(["scancel", "--signal=USR1", *(["--batch"] if fw.usr1_to_batch else []), job], check=True, timeout=30)
        if not common.poll_until(lambda: common.squeue_state(job) == "PENDING", CAP_S, 0.05):
            return {"back_s": None, "error": f"job {job} not requeued within {CAP_S:.0f} s (state {common.squeue_state(job)!r})"}
        t_pending = time.time()
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+1"], capture_output=True, timeout=30)
        if not common.poll_until(lambda: common.squeue_state(job) not in ("PENDING", ""), 120, 0.05):
            return {"back_s": None, "error": f"job {job} did not start again (state {common.squeue_state(job)!r})"}
        t_running = time.time()
        back = common.poll_until(lambda: next((r for r in common.read_jsonl(steps0) if r["pid"] != old), None), CAP_S, POLL_S)
        if back is None:
            return {"back_s": None, "error": f"job {job} trained no step within {CAP_S:.0f} s of its restart"}
        reached = max(r["step"] for r in common.read_jsonl(steps0) if r["pid"] == old)
        queue_s = t_running - t_pending
        return {
            "back_s": back["time"] - t_fault - queue_s,
            "stop_s": t_pending - t_fault,
            "queue_s": queue_s,
            "start_s": back["time"] - t_running,
            "steps_lost": max(0, reached - (back["step"] - 1)),
        }
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
        common.poll_until(lambda: common.squeue_state(job) == "", 60, 0.2)


USR1_KEYS = ("back_s", "stop_s", "queue_s", "start_s", "steps_lost")


def summary(values: list[float | None]) -> dict[str, Any]:
    """Median, min, max of the trials that measured something; how many did not."""
    got = [v for v in values if v is not None]
    return {
        "median": statistics.median(got) if got else None,
        "min": min(got) if got else None,
        "max": max(got) if got else None,
        "n": len(got),
        "missed": len(values) - len(got),
    }


ROWS = (
    ("crash -> next step trained (s)", "crash_back_s"),
    ("crash -> the group torn down (s)", "crash_detection_s"),
    ("crash -> the failed group trains again (s)", "crash_group_back_s"),
    ("crash: steps lost", "crash_steps_lost"),
    ("hang -> next step trained (s)", "hang_back_s"),
    ("hang -> the group torn down: detection (s)", "hang_detection_s"),
    ("hang -> the failed group trains again (s)", "hang_group_back_s"),
    ("hang: steps lost", "hang_steps_lost"),
    ("USR1 -> next step trained after the requeue, scheduling excluded (s)", "usr1_back_s"),
    ("USR1 -> the job requeued: save, stop, requeue (s)", "usr1_stop_s"),
    ("the requeued job running -> next step trained (s)", "usr1_start_s"),
    ("USR1: steps lost", "usr1_steps_lost"),
    ("SLURM's scheduling delay, left out (s)", "usr1_queue_s"),
    ("step time, no fault (s)", "steady_step_s"),
    ("blocked per checkpoint (s)", "steady_blocked_s"),
)


def not_applicable(name: str, key: str) -> str | None:
    """Why a figure does not apply to a framework (None: it does)."""
    return next((f.skip(key) for f in frameworks() if f.name == name), None)


def cell(x: dict[str, Any]) -> str:
    """``median (min-max, n)``; ``never (n of n)`` when no trial got there within the cap."""
    if x["median"] is None:
        return f"never in {CAP_S:.0f} s ({x['missed']} of {x['missed']})" if x["missed"] else "-"
    fmt = (lambda v: f"{v:.0f}") if abs(x["median"]) >= 10 or float(x["median"]).is_integer() else (lambda v: f"{v:.3g}")
    missed = f", {x['missed']} never" if x["missed"] else ""
    return f"{fmt(x['median'])} ({fmt(x['min'])}-{fmt(x['max'])}, n={x['n']}{missed})"


def ratio(ours: dict[str, Any], peer: dict[str, Any]) -> str:
    """ours / peer of the medians (``-`` where either is missing or zero)."""
    if ours["median"] is None or peer["median"] is None or not peer["median"]:
        return "-"
    return f"{ours['median'] / peer['median']:.2f}"


def summarize(trials: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each framework's figures over its trials (``summary`` of each)."""
    keys = {"crash": FAULT_KEYS, "hang": FAULT_KEYS, "usr1": USR1_KEYS, "steady": ("step_s", "blocked_s")}
    return {
        name: {f"{kind}_{key}": summary([t.get(key) for t in kinds.get(kind, [])]) for kind in keys for key in keys[kind]}
        for name, kinds in trials.items()
    }


def render(summary: dict[str, dict[str, dict[str, Any]]], missing: dict[str, str]) -> str:
    """The markdown table: a row per figure, a column per framework, and ours/peer ratios."""
    names = list(summary)
    peers = [n for n in names if n != "ours"]
    head = ["figure", *names, *(f"ours/{p}" for p in peers if "ours" in summary)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key in ROWS:
        cells = [not_applicable(n, key) or cell(summary[n][key]) for n in names]
        ratios = (
            [("-" if not_applicable(p, key) else ratio(summary["ours"][key], summary[p][key])) for p in peers] if "ours" in summary else []
        )
        lines.append("| " + " | ".join([label, *cells, *ratios]) + " |")
    for name, why in missing.items():
        lines.append(f"\n{name}: not run: {why}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="framework names (default: all)")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), help=f"{', '.join(KINDS)} (default: all)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ckpt-peers"))
    parser.add_argument("--json", type=Path, help="write the raw trials and the summary here")
    parser.add_argument("--render", type=Path, help="only print the table of a --json file written before")
    args = parser.parse_args()
    if args.render:
        if not args.render.is_file():
            parser.error(
                f"--render {args.render}: no such file (a --json file of an earlier run, e.g. bench/peers/results-2026-12-07.json)"
            )
        done = json.loads(args.render.read_text())
        print(render(summarize(done["trials"]), done["missing"]))
        return 0
    import shutil

    shutil.rmtree(args.work, ignore_errors=True)
    fws = [f for f in frameworks() if not args.only or f.name in args.only]
    missing = {f.name: f.missing for f in fws if f.missing}
    kinds = list(args.kinds)
    if "usr1" in kinds and (why := slurm_missing()):
        print(f"run_peers: the USR1 trials are left out: {why}", file=sys.stderr)
        kinds.remove("usr1")
        missing["USR1 -> requeue (every framework)"] = why
    runnable = [f for f in fws if f.missing is None]
    trials: dict[str, dict[str, list[dict[str, Any]]]] = {f.name: {k: [] for k in KINDS} for f in runnable}
    for n in range(args.trials):
        for kind in kinds:
            takes = [f for f in runnable if f.runs(kind)]
            for fw in random.sample(takes, len(takes)):
                work = args.work / f"{fw.name}-{kind}-{n}"
                got = (
                    steady_trial(fw, work) if kind == "steady" else usr1_trial(fw, work) if kind == "usr1" else fault_trial(fw, kind, work)
                )
                print(json.dumps({"framework": fw.name, "kind": kind, "trial": n, **got}), flush=True)
                trials[fw.name][kind].append(got)
    result: dict[str, Any] = {"trials": trials, "missing": missing, "summary": {}}
    result["summary"] = summarize(trials)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(render(result["summary"], result["missing"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
