"""Figure 5: host memory of async saves: (a) peak added by one save, (b) growth over many saves.

Each part runs in a fresh subprocess of this script (``--part peak|growth``), so one does not
inherit the other's heap.

(a) peak: the ~1 GB model of figure 1 (--quick ~128 MB) with SGD without momentum and warm zero
gradients. Warm-up: a sync save of a tiny model through another manager (imports and DCP code
paths), then ``gc.collect()``. Baseline = RSS after that. Then the peak is reset
(``echo 5 > /proc/self/clear_refs`` resets VmHWM), ONE ``async_save=True`` save runs to its
commit (``save()`` + ``wait()``), and peak added = VmHWM - baseline; an RSS sampler thread (every
5 ms, psutil) cross-checks it. Also reported: RSS kept after the save (the stager keeps its
staging buffer for the next save), and the peak added (over the RSS after the first save) by a
second save made with every ``param.grad`` None, where torch's ``get_state_dict`` allocates a
zero gradient for every parameter to initialise the stateless optimizer. Target: peak added
<= 1.1 x state bytes.

(b) growth: a ~200 MB model (--quick ~50 MB), retention keep_last=2, 50 async saves (--quick 15),
each followed by ``optimizer.step()`` and the manager's ``wait()``; RSS after ``gc.collect()`` is
read after every save. Target: RSS after save 50 - RSS after save 5 <= 5% of the state bytes
(the slope over saves 5..50 is reported too).
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import common
from common import GB, MB, Result, Row

PEAK_TARGET = 1.1
GROWTH_TOLERANCE = 0.05  # of the state bytes
EARLY_SAVE = 5


def warm_up(work: Path) -> None:
    tiny = common.build_model(1e6, layers=2)
    mgr = common.manager(work / "warmup", tiny, common.make_optimizer(tiny))
    mgr.save(0)
    mgr.close()


def peak(work: Path, state_bytes: float) -> dict[str, Any]:
    from ckpt_tool.core.retention import RetentionPolicy

    warm_up(work)
    model = common.build_model(state_bytes)
    optimizer = common.make_optimizer(model)
    mgr = common.manager(work / "ckpt", model, optimizer, async_save=True, retention=RetentionPolicy(keep_last=1))
    gc.collect()
    baseline = common.rss_bytes()
    reset = common.reset_peak_rss()
    with common.RssSampler() as sampler:
        mgr.save(1)
        mgr.wait()
    hwm = common.peak_rss_bytes()
    gc.collect()
    after = common.rss_bytes()
    with common.without_grads(model):  # a second save, staging buffer already there, grads None
        common.reset_peak_rss()
        mgr.save(2)
        mgr.wait()
        hwm_no_grads = common.peak_rss_bytes()
    mgr.close()
    return {
        "state_bytes": common.state_nbytes(model),
        "baseline": baseline,
        "hwm": hwm,
        "hwm_reset": reset,
        "sampled_peak": sampler.peak,
        "samples": sampler.samples,
        "after": after,
        "hwm_second_save_no_grads": hwm_no_grads,
    }


def growth(work: Path, state_bytes: float, saves: int) -> dict[str, Any]:
    from ckpt_tool.core.retention import RetentionPolicy

    model = common.build_model(state_bytes)
    optimizer = common.make_optimizer(model)
    mgr = common.manager(work / "ckpt", model, optimizer, async_save=True, retention=RetentionPolicy(keep_last=2))
    rss = []
    for step in range(1, saves + 1):
        mgr.save(step)
        optimizer.step()
        mgr.wait()
        gc.collect()
        rss.append(common.rss_bytes())
        if step % 10 == 0:
            common.log(f"save {step}: RSS {rss[-1] / MB:.1f} MB")
    mgr.close()
    return {"state_bytes": common.state_nbytes(model), "rss_after_save": rss}


def slope(values: list[int]) -> float:
    """Least-squares slope of ``values`` against their index (bytes per save)."""
    xs = range(len(values))
    mx, my = statistics.mean(xs), statistics.mean(values)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / den if den else 0.0


def peak_rows(p: dict[str, Any]) -> tuple[list[Row], list[str]]:
    state = p["state_bytes"]
    added = p["hwm"] - p["baseline"]
    ratio = added / state
    target, met = common.at_most(ratio, PEAK_TARGET)
    reference = f"state {state / GB:.3f} GB"
    rows = [
        Row("(a) peak RSS added by one async save (VmHWM)", f"{added / GB:.3f} GB", reference, round(ratio, 3), target, met),
        Row(
            "(a) same, sampled every 5 ms (info)",
            f"{(p['sampled_peak'] - p['baseline']) / GB:.3f} GB",
            reference,
            round((p["sampled_peak"] - p["baseline"]) / state, 3),
        ),
        Row(
            "(a) RSS kept after the save committed (info)",
            f"{(p['after'] - p['baseline']) / GB:.3f} GB",
            reference,
            round((p["after"] - p["baseline"]) / state, 3),
        ),
        Row(
            "(a) peak added by a 2nd save, param.grad None (info)",
            f"{(p['hwm_second_save_no_grads'] - p['after']) / GB:.3f} GB",
            reference,
            round((p["hwm_second_save_no_grads"] - p["after"]) / state, 3),
        ),
    ]
    notes = [
        f"(a) baseline RSS {p['baseline'] / GB:.3f} GB (model, gradients, manager, warm-up); VmHWM reset worked: {p['hwm_reset']}; {p['samples']} RSS samples"
    ]
    return rows, notes


def growth_rows(g: dict[str, Any]) -> tuple[list[Row], list[str]]:
    state, rss = g["state_bytes"], g["rss_after_save"]
    n = len(rss)
    early, last = rss[EARLY_SAVE - 1], rss[-1]
    grown = last - early
    ratio = grown / state
    target, met = common.at_most(ratio, GROWTH_TOLERANCE)
    per_save = slope(rss[EARLY_SAVE - 1 :])
    rows = [
        Row(
            f"(b) RSS after save {n} - after save {EARLY_SAVE}",
            f"{grown / MB:+.1f} MB",
            f"state {state / MB:.0f} MB; RSS after save {EARLY_SAVE}: {early / MB:.0f} MB",
            round(ratio, 4),
            target,
            met,
        )
    ]
    spread = (max(rss[EARLY_SAVE - 1 :]) - min(rss[EARLY_SAVE - 1 :])) / MB
    notes = [
        f"(b) RSS over saves {EARLY_SAVE}..{n}: slope {per_save / MB:+.3f} MB/save, max-min {spread:.1f} MB; after save 1: {rss[0] / MB:.0f} MB"
    ]
    return rows, notes


def run_parts(args: Any) -> None:
    base = [sys.executable, __file__, "--work-dir", str(args.work_dir)] + (["--quick"] if args.quick else [])
    p = common.run_json(base + ["--part", "peak"], timeout_s=600)
    g = common.run_json(base + ["--part", "growth"], timeout_s=600)
    result = Result("5", "Host memory of async saves")
    for rows, notes in (peak_rows(p), growth_rows(g)):
        result.rows += rows
        result.notes += notes
    result.details = {"peak": p, "growth": g}
    result.emit()


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument(
        "--part", choices=("peak", "growth"), help="run one part in this process (run_all and the default run both, each in a subprocess)"
    )
    parser.add_argument("--saves", type=int, default=None, help="saves for part (b) (default 50; --quick 15)")
    args = parser.parse_args()
    if args.part is None:
        run_parts(args)
        return
    with common.scratch_dir(args.work_dir, f"memory_{args.part}") as work:
        if args.part == "peak":
            data = peak(work, 0.128 * GB if args.quick else 1.0 * GB)
        else:
            data = growth(work, 0.05 * GB if args.quick else 0.2 * GB, args.saves or (15 if args.quick else 50))
    print(json.dumps(data), flush=True)


if __name__ == "__main__":
    main()
