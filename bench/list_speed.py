"""Figure 7: `ckpt list` with 10 vs 10,000 committed checkpoints (seconds).

How: one real checkpoint of a small model (~1 MB) is saved with ``CheckpointManager``; its
manifest is the template. Two checkpoint directories are then filled with 10 and 10,000 (--quick
1,000) committed checkpoints, steps 10, 20, ...: each a ``step_XXXXXXXX`` directory holding a
copy of the template manifest with ``step`` (and ``created_at``) rewritten, plus one ``commit``
line per step in ``index.jsonl`` (``ckpt_tool.core.index.format_event`` of
``ckpt_tool.core.listing.commit_summary``, as ``CheckpointStore.commit`` writes it) and LATEST
naming the newest. The step directories hold no data files: listing never opens them
(``store.inventory.listing()`` lists the directory, checks each step's manifest exists, and reads
the index; manifests only for steps the index does not describe).

Timed: ``listing(CheckpointStore(dir))`` in process (median of repetitions, the two sizes
alternating; warm caches), once more after ``drop_caches=3`` (cold, info), and ``ckpt list DIR
--json`` as a subprocess (wall time: interpreter start, imports, JSON printing), the sizes
alternating. Every listing must return one committed row per step. Targets: at 10,000
checkpoints, rows() <= 0.5 s and the CLI <= 1 s ("well under a second"); the ratio column is
10,000 / 10.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats

ROWS_TARGET_S = 0.5
CLI_TARGET_S = 1.0
STEP_EVERY = 10


def template_manifest(work: Path) -> Any:
    from ckpt_tool.store.store import CheckpointStore

    model, _ = common.save_checkpoint(work / "template", 1e6, step=STEP_EVERY)
    del model
    return CheckpointStore(work / "template").read_manifest(STEP_EVERY)


def populate(directory: Path, count: int, template: Any) -> None:
    """``count`` committed checkpoints (manifest + index line each) and LATEST."""
    from ckpt_tool.core import layout
    from ckpt_tool.core.index import format_event
    from ckpt_tool.core.listing import commit_summary

    directory.mkdir(parents=True)
    raw = json.loads(template.to_json())
    lines = []
    for i in range(1, count + 1):
        step, created = i * STEP_EVERY, template.created_at + i
        raw["step"], raw["created_at"] = step, created
        step_dir = directory / layout.step_dir_name(step)
        step_dir.mkdir()
        (step_dir / layout.MANIFEST_NAME).write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
        lines.append(format_event("commit", created, **commit_summary(dataclasses.replace(template, step=step, created_at=created))))
    (directory / layout.INDEX_NAME).write_text("".join(lines))
    (directory / layout.LATEST_NAME).write_text(layout.format_pointer(count * STEP_EVERY))
    os.sync()


def check_rows(rows: list[Any], count: int) -> None:
    assert len(rows) == count, (len(rows), count)
    assert all(r.status == "committed" and r.bytes for r in rows), rows[:3]
    assert rows[-1].latest and rows[-1].step == count * STEP_EVERY


def timed_rows(directory: Path, count: int) -> float:
    """Seconds of ``listing(CheckpointStore(dir))`` alone (the check of its result is not timed)."""
    from ckpt_tool.store.inventory import listing
    from ckpt_tool.store.store import CheckpointStore

    seconds, rows = common.timed(lambda: listing(CheckpointStore(directory)).rows)
    check_rows(rows, count)
    return seconds


def cli_list(directory: Path, count: int) -> float:
    seconds, proc = common.time_command(common.ckpt_command("list", str(directory), "--json"))
    listed = json.loads(proc.stdout)["checkpoints"]
    assert len(listed) == count and listed[-1]["latest"], (len(listed), count)
    return seconds


def measure(dirs: dict[int, Path], reps: int, cold_runs: int, cli_reps: int) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {k: {n: [] for n in dirs} for k in ("rows", "rows_cold", "cli")}
    for n, d in dirs.items():
        timed_rows(d, n)  # warm-up: imports, dentries
    for _ in range(reps):
        for n, d in dirs.items():
            out["rows"][n].append(timed_rows(d, n))
    for _ in range(cold_runs):
        for n, d in dirs.items():
            common.evict([])
            out["rows_cold"][n].append(timed_rows(d, n))
    for n, d in dirs.items():
        cli_list(d, n)  # warm-up: the libraries in the page cache after the cold runs
    for i in range(cli_reps):
        for n, d in dirs.items():
            out["cli"][n].append(cli_list(d, n))
        common.log(f"ckpt list --json {i + 1}/{cli_reps}: " + ", ".join(f"{n}: {out['cli'][n][-1]:.3f} s" for n in dirs))
    return out


def report(times: dict[str, dict[int, list[float]]], small: int, large: int, build_s: float, index_bytes: int) -> Result:
    result = Result("7", f"`ckpt list` with {small} vs {large:,} committed checkpoints (seconds)")
    specs = (
        ("rows", f"store.inventory.listing(), {large:,} checkpoints", ROWS_TARGET_S),
        ("cli", f"`ckpt list DIR --json` wall time, {large:,} checkpoints", CLI_TARGET_S),
        ("rows_cold", f"store.inventory.listing() after drop_caches, {large:,} checkpoints (info)", None),
    )
    for key, label, bound in specs:
        big, ref = Stats.of(times[key][large]), Stats.of(times[key][small])
        target, met = common.at_most(big.median, bound) if bound is not None else ("-", None)
        result.rows.append(
            Row(
                label,
                big.fmt(3, "s"),
                f"same, {small} checkpoints: {ref.fmt(3, 's')}",
                round(big.median / ref.median, 1),
                target + (" s" if bound else ""),
                met,
            )
        )
    per = (Stats.of(times["rows"][large]).median - Stats.of(times["rows"][small]).median) / (large - small)
    result.notes.append(
        f"rows() costs {per * 1e6:.1f} us per extra checkpoint (warm); the {large:,}-checkpoint index.jsonl is {index_bytes / 1e6:.1f} MB"
    )
    result.notes.append(
        f"the targets apply to the {large:,}-checkpoint directory (absolute seconds); ratio = {large:,} / {small}. Building the {large:,} checkpoints took {build_s:.1f} s (not timed in the figures)"
    )
    result.details = {"seconds": {k: {str(n): v for n, v in d.items()} for k, d in times.items()}, "index_bytes": index_bytes}
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--reps", type=int, default=None, help="timed rows() calls per size (default 15; --quick 5)")
    args = parser.parse_args()
    from ckpt_tool.core import layout

    small, large = (10, 1_000) if args.quick else (10, 10_000)
    reps = args.reps or (5 if args.quick else 15)
    cold_runs = 2 if args.quick else 3
    cli_reps = 3 if args.quick else 5
    with common.scratch_dir(args.work_dir, "list_speed") as work:
        template = template_manifest(work)
        dirs = {small: work / f"ckpt_{small}", large: work / f"ckpt_{large}"}
        build_s = 0.0
        for n, d in dirs.items():
            seconds, _ = common.timed(lambda d=d, n=n: populate(d, n, template))
            build_s = seconds
            common.log(f"{n} checkpoints written in {seconds:.1f} s")
        index_bytes = (dirs[large] / layout.INDEX_NAME).stat().st_size
        times = measure(dirs, reps, cold_runs, cli_reps)
    report(times, small, large, build_s, index_bytes).emit()


if __name__ == "__main__":
    main()
