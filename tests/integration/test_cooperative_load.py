"""The cooperative load (training/verified_reader.py, core/load_schedule.py) on real torchrun
ranks over gloo: every kind of entry (plain and bf16 tensors, a strided one, a scalar, plain
data) arrives intact on every rank for DDP, FSDP and HSDP layouts, in whole and in tiny chunks;
measured from outside with strace, each data file is read once in the whole job and ``.metadata``
once; a damaged file read by one rank fails the load on every rank with the file named. Left to
itself (``cooperative=None``) the load cooperates across nodes only: on one node every rank reads
for itself (the replicated bytes once per rank)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ckpt_tool.recipes.io_trace import strace_available, traced

WORKER = Path(__file__).with_name("coop_load_worker.py")

pytestmark = pytest.mark.skipif(not strace_available(), reason="strace is not installed: the reads are measured with it")


def launch(tmp_path: Path, nproc: int, layout: str, *extra: str, env: dict[str, str] | None = None):
    ckpt = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(WORKER)]
    run = traced([*cmd, "--dir", str(ckpt), "--layout", layout, *extra], ckpt, env=env, timeout=300)
    sizes = json.loads((tmp_path / "entries.json").read_text())
    outcomes = [(tmp_path / f"rank{r}.txt").read_text() if (tmp_path / f"rank{r}.txt").exists() else "no outcome" for r in range(nproc)]
    return run, sizes, outcomes


def assert_each_byte_read_once(run, sizes) -> None:
    assert run.read[".metadata"] == sizes[".metadata"] and run.readers[".metadata"] == 1  # not once per rank, and again by DCP
    data = [n for n in sizes if n.endswith(".distcp")]
    assert all(run.readers.get(n) == 1 for n in data), run.readers  # by one process of the job each
    # each byte once, plus the few header bytes read ahead to find each tensor's layout (checked in the pass)
    assert sum(sizes[n] for n in data) <= run.total(data) <= 1.1 * sum(sizes[n] for n in data), (sizes, run.read)


@pytest.mark.parametrize(
    ("nproc", "layout", "extra"), [(4, "fsdp", ("--chunk-bytes", "1000")), (4, "hsdp", ())], ids=["fsdp-4-small-chunks", "hsdp-2x2"]
)
def test_every_rank_gets_every_entry_and_each_file_is_read_once(tmp_path, nproc, layout, extra):
    run, sizes, outcomes = launch(tmp_path, nproc, layout, *extra)
    assert run.returncode == 0, run.output[-3000:]
    assert outcomes == ["equal"] * nproc
    assert_each_byte_read_once(run, sizes)


def test_a_damaged_file_read_by_one_rank_fails_the_load_on_every_rank_by_name(tmp_path):
    run, _, outcomes = launch(tmp_path, 4, "hsdp", "--damage", "__1_0.distcp")
    assert run.returncode != 0
    for outcome in outcomes:
        assert outcome.startswith("CkptError") and "__1_0.distcp does not match the manifest" in outcome, (outcome, run.output[-3000:])
    assert run.readers["__1_0.distcp"] == 1  # found by the rank that read it, told to the others


def test_left_to_itself_on_one_node_each_rank_reads_for_itself(tmp_path):
    # on one node the page cache serves each byte from storage once already
    env = {k: v for k, v in os.environ.items() if k != "CKPT_COOPERATIVE_LOAD"}
    run, sizes, outcomes = launch(tmp_path, 2, "ddp", "--auto", env=env)
    assert run.returncode == 0 and outcomes == ["equal"] * 2, run.output[-3000:]
    data = [n for n in sizes if n.endswith(".distcp")]
    assert all(run.readers[n] == 2 for n in data) and run.total(data) >= 2 * sum(sizes[n] for n in data)  # each replica reads it all
    assert run.read[".metadata"] == 2 * sizes[".metadata"]  # once per rank (DCP reads the bytes checked, not the file again)


def test_left_to_itself_across_nodes_the_ddp_replicas_read_each_byte_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CKPT_COOPERATIVE_LOAD"}
    run, sizes, outcomes = launch(tmp_path, 2, "ddp", "--auto", "--node-per-rank", env=env)
    assert run.returncode == 0 and outcomes == ["equal"] * 2, run.output[-3000:]
    assert_each_byte_read_once(run, sizes)
