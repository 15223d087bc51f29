"""Pre-warmed spare rank processes (supervise.warm_pool, warm_rank, handoff): real processes.

The launcher (what torchrun runs for a rank under ``ckpt run``) is started here directly, with
the environment torchrun would add; the pool is the one ``ckpt run`` keeps. A spare imports
torch (a few seconds on this machine), so each test waits for it to be ready first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ckpt_tool.recipes.launch import ckpt_run_command
from ckpt_tool.supervise.handoff import ENV_POOL
from ckpt_tool.supervise.spare_maker import untaken
from ckpt_tool.supervise.warm_pool import WarmPool

SCRIPT = """
import json, os, sys, time
import torch
out = {"pid": os.getpid(), "ppid": os.getppid(), "warm": os.environ.get("CKPT_WARM_START"), "argv": sys.argv,
       "cwd": os.getcwd(), "threads": torch.get_num_threads(), "rank": os.environ.get("RANK")}
print("hello from the rank", flush=True)
log = open(os.path.join(os.getcwd(), "top_level.log"), "w")  # never closed: must still reach the disk
log.write("written, not flushed")
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
if len(sys.argv) > 2 and sys.argv[2] == "sleep":
    time.sleep(60)
if len(sys.argv) > 2 and sys.argv[2] == "kill9":
    os.kill(os.getpid(), 9)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 0)
"""


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WarmPool]:
    env = {**os.environ, ENV_POOL: str(tmp_path / "pool")}
    env.pop("OMP_NUM_THREADS", None)
    p = WarmPool(tmp_path / "pool", 1, env, (), tmp_path / "warm.log")
    p.fill()
    deadline = time.monotonic() + 120
    while not list((tmp_path / "pool").glob("*.sock")):
        assert time.monotonic() < deadline and p.off_reason is None, (tmp_path / "warm.log").read_text()
        time.sleep(0.05)
    yield p
    p.close()


def launch(pool: WarmPool, work: Path, *args: str, **extra_env: str) -> subprocess.Popen:
    (work / "script.py").write_text(SCRIPT)
    env = {**pool.env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", **extra_env}
    out = open(work / "out.txt", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "ckpt_tool.supervise.handoff", "script.py", str(work / "result.json"), *args],
        cwd=work,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def test_a_spare_takes_the_rank_over_as_python_would_run_it(pool: WarmPool, tmp_path: Path) -> None:
    spare = untaken(pool.directory)[0]
    proc = launch(pool, tmp_path, "3")
    assert proc.wait(60) == 3  # the script's exit status, through the launcher
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["pid"] == spare and result["warm"] == "1"
    assert result["argv"] == ["script.py", str(tmp_path / "result.json"), "3"] and result["cwd"] == str(tmp_path)
    assert result["threads"] == 1, "OMP_NUM_THREADS of the rank, not of the spare"
    assert result["rank"] == "0"
    assert "hello from the rank" in (tmp_path / "out.txt").read_text()  # the launcher's stdout
    assert (tmp_path / "top_level.log").read_text() == "written, not flushed"  # closed at the fast exit
    assert untaken(pool.directory) == []  # taken


def test_a_rank_killed_by_a_signal_ends_its_launcher_with_the_same_signal(pool: WarmPool, tmp_path: Path) -> None:
    proc = launch(pool, tmp_path, "kill9")
    assert proc.wait(60) == -signal.SIGKILL


def test_sigterm_is_passed_on_and_sigkill_of_the_launcher_takes_the_rank_with_it(pool: WarmPool, tmp_path: Path) -> None:
    proc = launch(pool, tmp_path, "sleep")
    deadline = time.monotonic() + 60
    while not (tmp_path / "result.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    rank = psutil.Process(json.loads((tmp_path / "result.json").read_text())["pid"])
    assert "script.py" in " ".join(rank.cmdline())  # ps shows the rank's command
    proc.kill()
    proc.wait(10)
    rank.wait(10)  # gone within seconds, not after its 60 s sleep
    assert not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE


def test_a_rank_whose_environment_differs_starts_cold_and_the_pool_stops(pool: WarmPool, tmp_path: Path) -> None:
    proc = launch(pool, tmp_path, "0", CUDA_VISIBLE_DEVICES="5")
    assert proc.wait(60) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["warm"] is None and result["pid"] == proc.pid  # exec'd the plain command
    assert "starts cold: the environment differs from the spare's in CUDA_VISIBLE_DEVICES" in (tmp_path / "out.txt").read_text()
    deadline = time.monotonic() + 10
    while pool.off_reason is None:
        assert time.monotonic() < deadline
        pool.keep(healthy=False)
        time.sleep(0.05)
    assert "CUDA_VISIBLE_DEVICES" in pool.off_reason
    assert pool.fill() == 0


def test_without_a_pool_the_launcher_is_the_plain_command(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != ENV_POOL}
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.supervise.handoff", "script.py", str(tmp_path / "r.json"), "4"], cwd=tmp_path, env=env, timeout=60
    )
    assert proc.returncode == 4 and json.loads((tmp_path / "r.json").read_text())["warm"] is None


def test_ckpt_run_starts_ranks_warm_and_records_them(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    run_dir = tmp_path / "run"
    cmd = ckpt_run_command(2, run_dir, [])[:-2] + [str(tmp_path / "script.py"), str(tmp_path / "r.json")]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["warm"] == "1" and result["threads"] == 1
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events][-1] == "finished"


def test_a_taken_spare_is_replaced_by_a_fork_in_milliseconds_and_close_ends_the_spares(pool: WarmPool, tmp_path: Path) -> None:
    proc = launch(pool, tmp_path, "0")
    assert proc.wait(60) == 0
    assert untaken(pool.directory) == []
    pool._asked_at = -10.0  # as long after the last request as the pool waits between two
    t0 = time.monotonic()
    assert [name for name, _ in pool.keep(healthy=True)] == ["spares_started"]
    while not untaken(pool.directory):
        assert time.monotonic() - t0 < 5, (tmp_path / "warm.log").read_text()
        time.sleep(0.005)
    spares = [psutil.Process(pid) for pid in untaken(pool.directory)]
    assert all(p.ppid() == pool.maker.pid for p in spares)  # forked by the maker, not a new interpreter
    pool.close()
    assert pool.maker.returncode == 0
    for p in spares:
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
