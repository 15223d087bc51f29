"""Figure 19: each byte read once (#36): bytes read from storage per byte of checkpoint at a
resume, with every rank reading for itself (before) and with the cooperative load (after), and
the resume's wall time against torch's own ``dcp.load``.

The model (``load_once_worker.py``): 8 square ``nn.Linear`` layers with AdamW state (parameters,
exp_avg, exp_avg_sq), about 48 MB of checkpoint (``--quick``: 8 MB), saved once by the
checkpoint manager (4 files per rank) on each mesh: DDP on 2 and 4 ranks, FSDP2 on 4, HSDP 2 x 2
(FSDP2 on a (dp_replicate, dp_shard) mesh), tensor parallel 2 x FSDP2 2. Then resumed by
``CheckpointManager.resume()`` under torchrun (gloo, CPU) with ``cooperative_load`` off (each
rank reads every file it needs an item from, as DCP does; ``.metadata`` by every rank) and on.

Bytes read are measured from outside the ranks: ``strace -f`` of the whole torchrun, the bytes
returned by read system calls on any file under the checkpoint directory (the step's data files,
``.metadata``, manifest, rank state, LATEST, the index), divided by the bytes of the step
directory. The page cache is warm (this counts what the ranks ask of the filesystem, which on a
shared filesystem is what crosses the network; on this machine it is served from memory).
Target: <= 1.1 for every mesh.

Wall time: DDP on 4 ranks, without strace: the rank-0 time from a barrier before to a barrier
after ``resume()`` (cooperative, plain) and ``dcp.load`` of the same state dicts through torch's
own reader (no hash checks, no structure check), rotated, 5 trials each (``--quick``: 1). The
four ranks share this machine's page cache, as the ranks of one node do: there the resume does
not cooperate by default (``cooperative_load=None``), and that resume is held to the target, no
slower than ``dcp.load``; the cooperative one, forced on, is shown beside it (info): on one node
it saves no storage read (the page cache shares them) and adds the copy between the ranks over the
loopback. Across nodes the trade is the other way round (storage shared by every node against a
network per node); this machine has one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import common
from common import Result, Row, Stats

from ckpt_tool.recipes.io_trace import strace_available, traced

WORKER = Path(__file__).with_name("load_once_worker.py")
MESHES = (("DDP 2", "ddp", 2), ("DDP 4", "ddp", 4), ("FSDP 4", "fsdp", 4), ("HSDP 2 x 2", "hsdp", 4), ("TP 2 x FSDP 2", "tp_fsdp", 4))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(WORKER), *args]


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def ratios(work: Path, layout: str, nproc: int, state_mb: float) -> dict[str, float]:
    ckpt = work / layout / str(nproc) / "ckpt"
    common_args = ("--dir", str(ckpt), "--layout", layout, "--state-mb", str(state_mb))
    run(torchrun(nproc, *common_args, "--mode", "save"))
    step_bytes = sum(p.stat().st_size for p in (ckpt / "step_00000001").iterdir())
    out: dict[str, float] = {"checkpoint_mb": step_bytes / 1e6}
    for label, extra in (("before", ("--plain",)), ("after", ())):
        t = traced(torchrun(nproc, *common_args, "--mode", "resume", *extra), ckpt, env=ENV)
        if t.returncode != 0:
            raise RuntimeError(f"the traced resume failed ({t.returncode}):\n{t.output[-3000:]}")
        out[label] = t.total() / step_bytes
        out[f"{label}_metadata"] = t.read.get("step_00000001/.metadata", 0) / (ckpt / "step_00000001" / ".metadata").stat().st_size
        data = [n for n in t.read if n.endswith(".distcp")]
        out[f"{label}_most_readers"] = max(t.readers[n] for n in data)
    return out


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=5, help="timed rounds of each load (default 5; --quick 1)")
    args = parser.parse_args()
    if not strace_available():
        raise SystemExit("strace is not installed: the bytes read are measured with it (apt-get install strace)")
    trials = 1 if args.quick else args.trials
    state_mb = 8 if args.quick else 48
    result = Result("19", "Each byte read once (#36): bytes read from storage per byte of checkpoint at a resume; resume vs dcp.load")
    with common.scratch_dir(args.work_dir, "load_once") as work:
        measured = {}
        for label, layout, nproc in MESHES:
            measured[label] = r = ratios(work, layout, nproc, state_mb)
            common.log(f"{label}: {r['before']:.2f} -> {r['after']:.3f} bytes read per byte ({r['checkpoint_mb']:.1f} MB)")
            result.rows.append(
                Row(
                    f"{label} ({r['checkpoint_mb']:.1f} MB): bytes read per byte of checkpoint, cooperative (reference: every rank for itself)",
                    f"{r['after']:.3f}",
                    f"{r['before']:.2f}; .metadata read {r['before_metadata']:.0f} -> {r['after_metadata']:.0f} times; "
                    f"processes reading one data file: up to {r['before_most_readers']:.0f} -> {r['after_most_readers']:.0f}",
                    round(r["after"], 3),
                    "<= 1.1",
                    r["after"] <= 1.1,
                )
            )
        ckpt = work / "ddp" / "4" / "ckpt"
        out = work / "times.json"
        run(
            torchrun(
                4,
                "--dir",
                str(ckpt),
                "--layout",
                "ddp",
                "--state-mb",
                str(state_mb),
                "--mode",
                "time",
                "--trials",
                str(trials),
                "--out",
                str(out),
            )
        )
        times = json.loads(out.read_text())
    coop, plain, dcp_load = (Stats.of(times[k]) for k in ("cooperative", "plain", "dcp.load"))
    common.log(f"DDP 4 resume: cooperative {coop.median:.3f} s, plain {plain.median:.3f} s, dcp.load {dcp_load.median:.3f} s")
    mb = measured["DDP 4"]["checkpoint_mb"]
    result.rows.append(
        Row(
            f"DDP 4 ranks, {mb:.1f} MB: resume() wall time as on one node (each rank reads for itself, hash-checked)",
            plain.fmt(3, "s"),
            f"dcp.load (torch's reader, no checks): {dcp_load.fmt(3, 's')}",
            round(plain.median / dcp_load.median, 3),
            "<= 1 (no slower)",
            plain.median <= dcp_load.median,
        )
    )
    result.rows.append(
        Row(
            f"DDP 4 ranks, {mb:.1f} MB: resume() wall time, cooperative forced on one node (info)",
            coop.fmt(3, "s"),
            f"dcp.load {dcp_load.fmt(3, 's')}; each rank for itself {plain.fmt(3, 's')}",
            round(coop.median / dcp_load.median, 3),
        )
    )
    result.notes.append(
        "bytes counted from outside the ranks (strace of the whole torchrun); page cache warm; every file under the checkpoint directory counts"
    )
    result.details = {"measured": measured, "times": times}
    result.emit()


if __name__ == "__main__":
    main()
