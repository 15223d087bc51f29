"""Figure 17: hangs explained (#34): from the hang to every rank's stacks on disk; the armed handler's cost per step.

(1) hang -> stacks on disk. The reference recipe under ``ckpt run`` (2 CPU ranks, gloo, FSDP2,
``--d-model 64 --n-layer 2 --corpus-tokens 60000``, 30 steps, a save every 10), with
``--hang-at-step 12 --hang-rank R`` (R = 1, 0 alternately): rank R loops forever in Python at step
12, once. The hang starts when the rank writes its marker file (``.tiny_gpt_hung_at_12``, just
before the loop: its mtime); the stacks are on disk at the newest mtime of
``RUN/hangs/<id>/rank_*.txt``. Split: detection (marker -> the watchdog finds the hang: the
``hang_report`` event's time less its ``stacks_s``; the step phase's 5 s timeout floor) and the
dump (found -> stacks on disk: signal, answer, write, every rank's). Also each rank's own answer time (``answer_s`` in its file's header: signal ->
dump settled), for the culprit (looping in Python) and its peer (blocked in C in a collective).
Every trial must name the right culprit and finish (exit 0).

(2) the armed handler's cost per step. Wall time, for information: in this process, a small
model's training step (an MLP of 4 x 1024 -> 1024 layers, batch 64, forward, backward, AdamW:
~40 ms on one core), blocks of 50 steps, alternating unarmed and armed
(``faulthandler.register(SIGRTMIN+4, all_threads=True)`` as ``supervise.stacks.arm`` does,
``unregister`` after) 20 times each after a warm-up block; the median over pairs of (armed -
unarmed) / unarmed. On this shared VM pairs spread by several percent, far wider than the
target, so the target is judged on instructions: callgrind counts a step of a small model
(64 -> 64 MLP, SGD) armed and not, each mode with 10 and 410 steps, per step = the difference
/ 400 (import and arming cancel out; ``PYTHONHASHSEED=0``). Target: < 0.1% of a step. The
handler adds no work to a step (it runs only when the signal comes); this measures it.
"""

from __future__ import annotations

import faulthandler
import statistics
import time
from pathlib import Path

import common
from common import Result, Row, Stats

from ckpt_tool.core.hang_report import parse_rank_file
from ckpt_tool.recipes.launch import RecipeJob
from ckpt_tool.supervise.run_dir import read_events
from ckpt_tool.supervise.stacks import STACKS_SIGNAL

HANG_AT = 12


def hang_trial(root: Path, hang_rank: int) -> dict[str, float]:
    job = RecipeJob(root, 30, 10, ("--hang-at-step", str(HANG_AT), "--hang-rank", str(hang_rank)))
    code = job.start().wait(300)
    if code != 0:
        raise RuntimeError(f"the run did not finish (exit {code}); see {job.log}")
    events = read_events(job.run_dir)
    [report] = [e for e in events if e["event"] == "hang_report"]
    if report["culprits"] != [hang_rank]:
        raise RuntimeError(f"wrong culprit: {report['culprits']} (rank {hang_rank} hung): {report['summary']}")
    started = (job.ckpt / f".tiny_gpt_hung_at_{HANG_AT}").stat().st_mtime
    hang_dir = Path(report["stacks"])
    files = sorted(hang_dir.glob("rank_*.txt"))
    on_disk = max(p.stat().st_mtime for p in files)
    found = report["time"] - report["stacks_s"]  # the watchdog found the hang stacks_s before its report
    ranks = {r.rank: r for r in (parse_rank_file(p.read_text()) for p in files) if r is not None}
    return {
        "total": on_disk - started,
        "detect": found - started,
        "dump": on_disk - found,
        "answer_culprit": float(ranks[hang_rank].answer_s or 0.0),
        "answer_peer": float(ranks[1 - hang_rank].answer_s or 0.0),
    }


def step_cost(pairs: int, steps: int) -> dict[str, float]:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 1024)

    def block() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) / steps

    block()  # warm-up
    sink = open("/dev/null", "w")
    ratios, plain, armed = [], [], []
    try:
        for _ in range(pairs):
            a = block()
            faulthandler.register(STACKS_SIGNAL, file=sink, all_threads=True, chain=False)
            b = block()
            faulthandler.unregister(STACKS_SIGNAL)
            plain.append(a)
            armed.append(b)
            ratios.append((b - a) / a)
    finally:
        sink.close()
    return {"step_s": statistics.median(plain), "armed_step_s": statistics.median(armed), "cost": statistics.median(ratios),
            "spread_lo": min(ratios), "spread_hi": max(ratios)}  # fmt: skip


CALLGRIND_STEPS = (10, 410)
CALLGRIND_SCRIPT = """
import faulthandler, signal, sys, torch
torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=1e-3); x = torch.randn(8, 64)
if sys.argv[1] == "armed":
    faulthandler.register(signal.SIGRTMIN + 4, file=open("/dev/null", "w"), all_threads=True, chain=False)
for _ in range(int(sys.argv[2])):
    model(x).square().mean().backward(); opt.step(); opt.zero_grad(set_to_none=True)
"""


def instructions_per_step(work: Path) -> dict[str, float] | None:
    """Instructions of one training step, armed and not, counted by callgrind (repeatable where
    wall time is not): each mode run with 10 and 410 steps, the difference over 400 steps (the
    import and the arming itself cancel out). None without valgrind."""
    import re
    import shutil
    import subprocess
    import sys

    if shutil.which("valgrind") is None:
        return None
    script = work / "cg_step.py"
    script.write_text(CALLGRIND_SCRIPT)
    counts: dict[tuple[str, int], int] = {}
    for mode in ("plain", "armed"):
        for n in CALLGRIND_STEPS:
            proc = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/cg.out", sys.executable, str(script), mode, str(n)],
                capture_output=True, text=True, timeout=900, env={**__import__("os").environ, "PYTHONHASHSEED": "0"},
            )  # fmt: skip
            m = re.search(r"Collected : (\d+)", proc.stderr)
            if proc.returncode != 0 or m is None:
                raise RuntimeError(f"callgrind failed: {proc.stderr[-500:]}")
            counts[(mode, n)] = int(m.group(1))
    lo, hi = CALLGRIND_STEPS
    per = {mode: (counts[(mode, hi)] - counts[(mode, lo)]) / (hi - lo) for mode in ("plain", "armed")}
    return {"plain": per["plain"], "armed": per["armed"], "cost": (per["armed"] - per["plain"]) / per["plain"]}


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=5, help="hangs to explain (default 5; --quick 2)")
    args = parser.parse_args()
    trials = 2 if args.quick else args.trials
    samples = []
    with common.scratch_dir(args.work_dir, "hang_stacks") as work:
        for i in range(trials):
            s = hang_trial(work / f"trial{i}", hang_rank=1 - i % 2)
            samples.append(s)
            common.log(
                f"trial {i + 1}/{trials}: hang -> stacks on disk {s['total']:.2f} s (detect {s['detect']:.2f}, dump {s['dump']:.3f})"
            )
    cost = step_cost(5 if args.quick else 20, 20 if args.quick else 50)
    common.log(f"armed handler, wall time: {cost['cost'] * 100:+.3f}% of a {cost['step_s'] * 1000:.1f} ms step")
    with common.scratch_dir(args.work_dir, "hang_stacks_cg") as work:
        counted = None if args.quick else instructions_per_step(work)
    if counted is not None:
        common.log(f"armed handler, instructions: {counted['cost'] * 100:+.4f}% of {counted['plain']:.0f} per step")

    def stats(key: str) -> Stats:
        return Stats.of([s[key] for s in samples])

    result = Result("17", f"Hangs explained (#34): hang -> every rank's stacks on disk ({trials} hangs), the armed handler's cost")
    result.rows.append(common.median_at_most("hang (rank loops in Python) -> both ranks' stacks on disk", stats("total"), 10.0))
    result.rows.append(Row("(1) detection: hang -> found by the watchdog (step timeout floor 5 s)", stats("detect").fmt(2, "s")))
    result.rows.append(Row("(2) dump: found -> every rank's stacks on disk", stats("dump").scaled(1000).fmt(0, "ms")))
    result.rows.append(
        Row("a rank's own answer, looping in Python (signal -> dump settled)", stats("answer_culprit").scaled(1000).fmt(0, "ms"))
    )
    result.rows.append(Row("a rank's own answer, blocked in C in a collective", stats("answer_peer").scaled(1000).fmt(0, "ms")))
    result.rows.append(
        Row(
            "armed handler, wall time: step armed vs not (median of 20 pairs of 50-step blocks)",
            f"{cost['cost'] * 100:+.3f}% (pairs {cost['spread_lo'] * 100:+.2f}% .. {cost['spread_hi'] * 100:+.2f}%)",
            f"step {cost['step_s'] * 1000:.2f} ms unarmed, {cost['armed_step_s'] * 1000:.2f} ms armed",
        )
    )
    if counted is not None:
        ratio = abs(counted["cost"])
        result.rows.append(
            Row(
                "armed handler, instructions per step armed vs not (callgrind, 400 steps)",
                f"{counted['cost'] * 100:+.4f}%",
                f"{counted['plain']:.0f} unarmed, {counted['armed']:.0f} armed",
                round(ratio / 0.001, 3),
                "cost < 0.1% of a step (either sign)",
                ratio < 0.001,
            )
        )
    else:
        result.notes.append("no valgrind (or --quick): the instruction count, which judges the < 0.1% target, was not measured")
    result.notes.append("every trial named the rank that hung as the culprit and finished (exit 0)")
    result.notes.append(
        "the dump row includes the 50 ms a file must stay unchanged to count as complete (SETTLED_S); "
        "a rank's own answer is the signal -> settled time"
    )
    result.emit()


if __name__ == "__main__":
    main()
