"""Run every checkpoint benchmark, each in a fresh process, and write BENCHMARKS.md.

Each script prints its result as JSON on the last line of stdout (see common.Result); this
collects them, describes the machine and renders one table per figure. A script that fails is
reported as failed in the file (and makes the exit status 1); a missed target is reported, not
an error. Default: full sizes, writes BENCHMARKS.md at the repository root. ``--quick``: small
sizes (a smoke test, ~4 minutes), prints the markdown instead unless ``--output`` is given.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SCRIPTS = (
    "save_throughput",
    "async_blocked",
    "async_modes",
    "async_floor",
    "load_throughput",
    "lookup",
    "memory",
    "validate_throughput",
    "list_speed",
    "watchdog",
    "requeue_chain",
    "reshard_speed",
    "node_fault",
    "tensor_parallel",
    "recovery_model",
    "local_tier",
    "stragglers",
    "hot_spares",
    "hang_stacks",
    "wrong_numbers",
    "load_once",
)
SCRIPT_TIMEOUT_S = 480
TIMEOUTS_S = {
    "watchdog": 900,
    "requeue_chain": 900,
    "reshard_speed": 900,
    "node_fault": 1500,
    "tensor_parallel": 900,
    "local_tier": 900,
    "stragglers": 1200,
    "hot_spares": 900,
    "load_once": 900,
}  # several torchrun launches, failures and recoveries (~6 min)


# ----------------------------------------------------------------------------- machine
def _command(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=BENCH_DIR).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _meminfo_gib() -> str:
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return f"{kib / 2**20:.1f} GiB"


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")


def _filesystem(path: Path) -> str:
    """Type, device and mount options of the filesystem holding ``path`` (longest mount prefix)."""
    path = path.resolve()
    best: tuple[str, ...] = ()
    with open("/proc/mounts") as f:
        for line in f:
            device, mount, fstype, options = line.split()[:4]
            if (path == Path(mount) or Path(mount) in path.parents) and len(mount) > len(best[1] if best else ""):
                best = (device, mount, fstype, options)
    if not best:
        return "?"
    device, mount, fstype, options = best
    return f"{fstype} on {device} mounted at {mount} ({options})"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "?"


def code_under_test() -> str:
    """Where the benchmark processes import ckpt_tool from (PYTHONPATH may point at another tree)."""
    found = _command(sys.executable, "-c", "import ckpt_tool, pathlib; print(pathlib.Path(ckpt_tool.__file__).parent.parent)")
    if not found or Path(found).resolve() != REPO:
        return f"{found or '?'} (set through PYTHONPATH, not this checkout)"
    commit = _command("git", "-C", str(REPO), "rev-parse", "--short", "HEAD")
    dirty = _command("git", "-C", str(REPO), "status", "--porcelain", "--", "ckpt_tool")
    return f"{REPO}, commit {commit}" + (" with uncommitted changes in ckpt_tool/" if dirty else "")


def code_fingerprint() -> str:
    """A short hash of every file under this checkout's ckpt_tool/ (other people edit and commit
    while the benchmarks run: a change between two scripts is reported with the figures)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((REPO / "ckpt_tool").rglob("*.py")):
        h.update(str(path.relative_to(REPO)).encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:12]


def machine(work_dir: Path) -> list[tuple[str, str]]:
    torch_version = _command(sys.executable, "-c", "import torch; print(torch.__version__)")
    return [
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("nproc", _command("nproc")),
        ("CPU", _cpu_model()),
        ("memory", _meminfo_gib()),
        ("bench directory", f"{work_dir} - {_filesystem(work_dir)}"),
        ("kernel", platform.release()),
        ("transparent hugepages", _read("/sys/kernel/mm/transparent_hugepage/enabled")),
        ("python / torch", f"{platform.python_version()} / {torch_version}"),
        ("ckpt_tool under test", f"{code_under_test()} (content hash {code_fingerprint()})"),
    ]


# ----------------------------------------------------------------------------- running
def run_script(name: str, work_dir: Path, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH_DIR / f"{name}.py"), "--work-dir", str(work_dir)] + (["--quick"] if quick else [])
    common.log(f"=== {name}")
    load_before = os.getloadavg()[0]
    code_before = code_fingerprint()
    start = time.perf_counter()
    try:
        result = common.run_json(cmd, TIMEOUTS_S.get(name, SCRIPT_TIMEOUT_S))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        result = {"figure": "?", "title": name, "error": str(exc)}
    result["script"] = name
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["load"] = (round(load_before, 2), round(os.getloadavg()[0], 2))
    result["code"] = (code_before, code_fingerprint(), _command("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"))
    common.log(f"=== {name}: {result['seconds']} s")
    return result


# ----------------------------------------------------------------------------- markdown
def _met(met: bool | None) -> str:
    return "info" if met is None else ("met" if met else "**NOT MET**")


def _ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:g}"


def figure_section(result: dict[str, Any]) -> list[str]:
    head = f"## {result['figure']}. {result['title']}"
    load = result.get("load")
    load_text = (
        f" Load average (1 min) before / after: {load[0]:g} / {load[1]:g} ({os.cpu_count()} CPUs; other jobs share this machine)."
        if load
        else ""
    )
    lines = [head, "", f"`bench/{result['script']}.py`, {result['seconds']} s.{load_text}"]
    code = result.get("code")
    if code and code[0] == code[1] and result.get("run_code") not in (None, code[0]):
        lines[-1] += (
            f" ckpt_tool/ changed before this script (content hash {code[0]}, HEAD {code[2]}; see the Machine table for the run's start)."
        )
    if code and code[0] != code[1]:
        lines[-1] += (
            f" **ckpt_tool/ changed while this script ran** (content hash {code[0]} -> {code[1]}, HEAD {code[2]} at its end): some of its runs measured the newer code."
        )
    if "error" in result:
        return lines + ["", f"**FAILED**: {result['error']}", ""]
    lines += [
        "",
        "| measured | value: median (min-max, n) | reference, same run | ratio | target | met? |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['measured']} | {row['value']} | {row['reference']} | {_ratio(row['ratio'])} | {row['target']} | {_met(row['met'])} |"
        )
    if result["notes"]:
        lines.append("")
        lines += [f"- {note}" for note in result["notes"]]
    return lines + [""]


def summary(results: list[dict[str, Any]]) -> list[str]:
    lines = ["| figure | measured | ratio | target | met? |", "| --- | --- | --- | --- | --- |"]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['figure']}. {result['title']} | script failed | - | - | **FAILED** |")
            continue
        for row in result["rows"]:
            if row["met"] is not None:
                lines.append(f"| {result['figure']} | {row['measured']} | {_ratio(row['ratio'])} | {row['target']} | {_met(row['met'])} |")
    return lines


def render(results: list[dict[str, Any]], machine_rows: list[tuple[str, str]], quick: bool, total_s: float) -> str:
    mode = "`--quick` (smoke-test sizes: NOT the reference figures)" if quick else "full sizes"
    lines = [
        "# Benchmarks of the checkpoint core",
        "",
        f"Generated by `bench/run_all.py` ({mode}) in {total_s:.0f} s. Reproduce with `make bench`, which runs",
        "`.venv/bin/python bench/run_all.py`; one figure alone: `.venv/bin/python bench/NAME.py` (`--help` says",
        "what it measures and how; `--quick` for small sizes). Each script runs in a fresh process.",
        "",
        "Speed targets are ratios to a reference measured in the same run on the same machine: absolute",
        "figures drift between runs on this shared VM (raw write + fsync of 1 GB varied 0.4-2.3 GB/s within",
        "minutes while these were written). Values are medians over repetitions, with min-max and n.",
        "GB = 1e9 bytes. Figures 1-7: the state is a model of 16 fp32 `nn.Linear` layers with SGD without",
        "momentum (no optimizer state), in one process without torch.distributed. Figure 8 runs the reference",
        "recipe (`ckpt_tool.recipes.tiny_gpt`, 2 CPU ranks, FSDP2) under `ckpt run` and torchrun.",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in machine_rows]
    lines += ["", "## Summary", ""] + summary(results) + [""]
    for result in results:
        lines += figure_section(result)
    return "\n".join(lines)


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file to write (default: BENCHMARKS.md at the repository root; --quick: print only)",
    )
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, default=list(SCRIPTS), help="run only these scripts")
    args = parser.parse_args()
    output = args.output or (None if args.quick else REPO / "BENCHMARKS.md")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    machine_rows = machine(args.work_dir)
    run_code = code_fingerprint()
    start = time.perf_counter()
    try:
        results = [run_script(name, args.work_dir, args.quick) for name in args.only]
    finally:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    for result in results:
        result["run_code"] = run_code
    markdown = render(results, machine_rows, args.quick, time.perf_counter() - start)
    if output is None:
        print(markdown)
    else:
        output.write_text(markdown)
        common.log(f"wrote {output}")
    failed = [r["script"] for r in results if "error" in r]
    if failed:
        common.log(f"failed: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
