"""Crash campaign, long mode: the power-cut test of tests/faults/test_crash_atomicity.py with many trials.

How: runs ``python -m pytest tests/faults/test_crash_atomicity.py -q -s`` from the repository
root with ``CKPT_FAULT_TRIALS=N`` (default 200; --quick 10) and ``CKPT_FAULT_SEED`` (default
the test's 1234). Each trial starts the reference recipe (2 CPU ranks, a checkpoint committed
every step, sync and async saves alternately, every other pair of trials under ``ckpt run``),
waits for a new commit, sleeps a random 0-1 s and SIGKILLs the whole process group (torchrun,
both ranks, and ckpt run's watchdog when there is one). After every kill the test checks that
LATEST names a complete, hash-valid checkpoint, that no committed checkpoint was lost, and that
the next start cleaned up what the previous crash left.

The test prints "N trials, K killed with a save in progress" when it passes; that line is
parsed. pytest-timeout's per-test limit from pyproject.toml is lifted (``--timeout=0``); this
script's --timeout bounds the run instead. Violations = 0 if the test passed, unknown if it
was cut short by a timeout, otherwise 1 with the assertion text in the notes
(the test stops at the first violation, so the trials run before it are not known exactly).
Target: 0 violations with at least 200 trials. Wall time is the pytest process's, interpreter
start included (~8 s per trial on the 2-core dev machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import common
from common import Result, Row

TEST = "tests/faults/test_crash_atomicity.py"
ROOT = Path(__file__).resolve().parent.parent
TARGET_TRIALS = 200
SUMMARY = re.compile(r"(\d+) trials, (\d+) killed with a save in progress")


def run_campaign(trials: int, seed: int, work: Path, timeout_s: float) -> dict:
    env = dict(os.environ, CKPT_FAULT_TRIALS=str(trials), CKPT_FAULT_SEED=str(seed))
    # --timeout=0: the project's pytest-timeout limit (600 s per test) would cut a long campaign short
    cmd = [sys.executable, "-m", "pytest", TEST, "-q", "-s", "-p", "no:cacheprovider", "--timeout=0", f"--basetemp={work / 'pytest'}"]
    common.log(f"{' '.join(cmd[1:])} with CKPT_FAULT_TRIALS={trials} CKPT_FAULT_SEED={seed}")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = None
    wall = time.perf_counter() - start
    return {"rc": rc, "output": out, "wall_s": wall}


def failure_text(output: str) -> str:
    """The assertion lines pytest printed (``E   ...``), or the tail of the output."""
    lines = [ln[1:].strip() for ln in output.splitlines() if ln.startswith("E ")]
    return " | ".join(lines[:6]) if lines else output.strip()[-800:]


def report(trials: int, seed: int, data: dict) -> Result:
    out, rc, wall = data["output"], data["rc"], data["wall_s"]
    match = SUMMARY.search(out)
    passed = rc == 0 and match is not None
    ran = int(match.group(1)) if match else None
    in_save = int(match.group(2)) if match else None
    result = Result("crash-campaign", f"Power-cut crash campaign ({trials} trials requested, seed {seed})")
    harness_timeout = rc is None or "Timeout (>" in out  # cut short, not an invariant failure
    violations: int | None = 0 if passed else (None if harness_timeout else 1)
    trials_ok = (ran or 0) >= TARGET_TRIALS
    result.rows.append(
        Row(
            "trials run",
            str(ran) if ran is not None else f"unknown (test did not finish; {trials} requested)",
            f"{TARGET_TRIALS} (long mode)",
            round((ran or 0) / TARGET_TRIALS, 3),
            f">= {TARGET_TRIALS}",
            trials_ok,
        )
    )
    result.rows.append(
        Row(
            "trials killed with a save in progress (info)",
            str(in_save) if in_save is not None else "unknown",
            f"of {ran} trials" if ran else "-",
            round(in_save / ran, 3) if ran else None,
        )
    )
    result.rows.append(
        Row(
            "invariant violations",
            "unknown (timed out)" if violations is None else str(violations),
            f"{ran if ran is not None else '?'} trials",
            None,
            "0 with >= 200 trials",
            passed and trials_ok,
        )
    )
    result.rows.append(Row("wall time (info)", f"{wall:.0f} s", f"{wall / ran:.1f} s per trial" if ran else "-"))
    if rc is None:
        result.notes.append(f"pytest killed by this script's --timeout after {wall:.0f} s")
    elif not passed:
        result.notes.append(f"pytest exited {rc}: {failure_text(out)}")
    result.notes.append(f"command: CKPT_FAULT_TRIALS={trials} CKPT_FAULT_SEED={seed} python -m pytest {TEST} -q -s (cwd {ROOT})")
    result.details = {
        "trials_requested": trials,
        "trials_run": ran,
        "killed_in_save": in_save,
        "returncode": rc,
        "passed": passed,
        "wall_s": round(wall, 1),
        "output_tail": out[-2000:],
    }
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=None, help=f"trials (default {TARGET_TRIALS}; --quick 10)")
    parser.add_argument("--seed", type=int, default=1234, help="CKPT_FAULT_SEED (default 1234, the test's)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before pytest is killed (default 60 + 30 per trial)")
    args = parser.parse_args()
    trials = args.trials or (10 if args.quick else TARGET_TRIALS)
    timeout = args.timeout or 60 + 30 * trials
    with common.scratch_dir(args.work_dir, "crash_campaign") as work:
        data = run_campaign(trials, args.seed, work, timeout)
    common.log(f"pytest rc={data['rc']} in {data['wall_s']:.0f} s")
    report(trials, args.seed, data).emit()


if __name__ == "__main__":
    main()
