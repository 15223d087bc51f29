"""Figure 4: newest-checkpoint lookup time with 10 vs 10,000 step directories present.

How: two checkpoint directories are filled with empty ``step_XXXXXXXX`` directories (10 and
10,000; --quick 10 and 1,000), names from ``ckpt_tool.core.layout.step_dir_name``, and a LATEST
file (``layout.format_pointer``) naming the newest. ``CheckpointStore(dir).read_latest()`` is
timed call by call, alternating between the two directories in blocks so drift hits both; the
figure is the median (min-max over the blocks' medians). For contrast, ``committed_on_disk()``
(a directory scan, as crash clean-up and retention do) is timed the same way with fewer calls,
and both are timed once per run after dropping the caches (cold; medians of a few runs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats

TARGET = 1.5
BLOCK = 100


def populate(directory: Path, count: int) -> None:
    from ckpt_tool.core import layout

    directory.mkdir(parents=True)
    for step in range(1, count + 1):
        (directory / layout.step_dir_name(step)).mkdir()
    (directory / layout.LATEST_NAME).write_text(layout.format_pointer(count))


def per_call_ns(fn: Callable[[], Any], calls: int) -> list[int]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return samples


def interleaved(fns: dict[int, Callable[[], Any]], calls: int, block: int) -> dict[int, tuple[float, list[float]]]:
    """Per size: (median of all calls in ms, medians of each block in ms)."""
    samples: dict[int, list[int]] = {n: [] for n in fns}
    blocks: dict[int, list[float]] = {n: [] for n in fns}
    for _ in range(max(1, calls // block)):
        for n, fn in fns.items():
            chunk = per_call_ns(fn, block)
            samples[n] += chunk
            blocks[n].append(statistics.median(chunk) / 1e6)
    return {n: (statistics.median(samples[n]) / 1e6, blocks[n]) for n in fns}


def cold_ms(fns: dict[int, Callable[[], Any]], runs: int) -> dict[int, Stats]:
    """Per size: milliseconds of one call right after dropping the caches, sizes alternating."""
    times: dict[int, list[float]] = {n: [] for n in fns}
    for _ in range(runs):
        for n, fn in fns.items():
            common.evict([])
            times[n].append(common.timed(fn)[0] * 1e3)
    return {n: Stats.of(t) for n, t in times.items()}


def stats_of(median: float, blocks: list[float], calls: int) -> Stats:
    return Stats(median, min(blocks), max(blocks), calls)


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--calls", type=int, default=None, help="timed read_latest() calls per size (default 5000; --quick 500)")
    args = parser.parse_args()
    from ckpt_tool.store.store import CheckpointStore

    small, large = (10, 1_000) if args.quick else (10, 10_000)
    calls = args.calls or (500 if args.quick else 5_000)
    scan_calls = 20 if args.quick else 60
    cold_runs = 3 if args.quick else 5
    with common.scratch_dir(args.work_dir, "lookup") as work:
        stores = {}
        for n in (small, large):
            populate(work / f"n{n}", n)
            stores[n] = CheckpointStore(work / f"n{n}")
            assert stores[n].read_latest() == n and stores[n].committed_on_disk() == []
        common.settle()
        common.log(f"read_latest x{calls} and committed_on_disk x{scan_calls} at {small} and {large} step directories")
        latest = interleaved({n: s.read_latest for n, s in stores.items()}, calls, BLOCK)
        scan = interleaved({n: s.committed_on_disk for n, s in stores.items()}, scan_calls, max(1, scan_calls // 10))
        cold_latest = cold_ms({n: s.read_latest for n, s in stores.items()}, cold_runs)
        cold_scan = cold_ms({n: s.committed_on_disk for n, s in stores.items()}, cold_runs)
    result = Result("4", f"Newest-checkpoint lookup, {small} vs {large:,} step directories (milliseconds)")
    lat_small, lat_large = (stats_of(*latest[n], calls) for n in (small, large))
    ratio = lat_large.median / lat_small.median
    target, met = common.at_most(ratio, TARGET)
    result.rows.append(
        Row(
            f"read_latest(), {large:,} dirs",
            lat_large.fmt(4, "ms"),
            f"same, {small} dirs: {lat_small.fmt(4, 'ms')}",
            round(ratio, 3),
            target,
            met,
        )
    )
    scan_small, scan_large = (stats_of(*scan[n], scan_calls) for n in (small, large))
    result.rows.append(
        Row(
            f"committed_on_disk() scan, {large:,} dirs (info)",
            scan_large.fmt(3, "ms"),
            f"same, {small} dirs: {scan_small.fmt(3, 'ms')}",
            round(scan_large.median / scan_small.median, 1),
        )
    )
    for name, cold, digits in (("read_latest()", cold_latest, 3), ("committed_on_disk()", cold_scan, 2)):
        ratio_cold = round(cold[large].median / cold[small].median, 2)
        result.rows.append(
            Row(
                f"{name} cold, {large:,} dirs (info)",
                cold[large].fmt(digits, "ms"),
                f"same, {small} dirs: {cold[small].fmt(digits, 'ms')}",
                ratio_cold,
            )
        )
    result.notes.append(
        f"warm figures: median of every call; min-max of the medians of blocks of {BLOCK} calls (read_latest), alternating sizes"
    )
    result.notes.append("cold: caches dropped (drop_caches=3 when allowed) before each call; this also drops the directory's dentries")
    result.details = {
        "read_latest_ms": {str(n): v[0] for n, v in latest.items()},
        "committed_on_disk_ms": {str(n): v[0] for n, v in scan.items()},
    }
    result.emit()


if __name__ == "__main__":
    main()
