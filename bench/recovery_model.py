"""Figure 13: the recovery time model: failure -> first resumed step at 8, 512 and 4096 ranks.

How: no measurement of its own. ``recovery_time`` (next to this script) takes the per-phase seconds
measured on this machine (figures 8 and 9: detection, teardown, new interpreters with torch,
``ckpt recover``'s fixed cost, ``resume()``'s fixed cost, one step) and the size of the job, and
adds what grows with it: the start's check of the newest checkpoint (every byte hashed on one
node, as ``ckpt recover`` did before #16, or its structure: one ``stat`` per file, 16 at once), the load (each
node reads its share; the hashes are checked as the bytes land), the rendezvous (one join per
node at the store). Storage figures are assumptions, printed with the table and set by flags:
one node reads at --node-read-gbps (its NIC or disk), all nodes together at --fs-aggregate-gbps.
"""

from __future__ import annotations

import common
from common import Result, Row
from recovery_time import CHECK, GB, Job, Measured, dominant, phases

SCALES = (8, 512, 4096)
# The per-phase figures before #16 (BENCHMARKS.md at a0899d6 and before): ranks started cold (new
# interpreters importing torch), `ckpt recover` imported torch and hashed every byte on one node.
BEFORE_16 = Measured(
    detect_crash_s=0.06,
    detect_hang_s=5.01,
    teardown_s=0.29,
    restart_s=5.31,
    cold_start_s=10.06,
    job_start_s=3.3,
    recover_fixed_s=4.53,
    resume_fixed_s=0.8,
    step_s=0.11,
)
PATHS = ("crash", "hang", "requeue")


def model(size_gb: float, node_read_gbps: float, fs_aggregate_gbps: float, ranks_per_node: int) -> Result:
    m = Measured()
    result = Result("13", f"Recovery time model: failure -> first resumed step, {size_gb:.0f} GB checkpoint (seconds)")
    details: dict[str, dict[str, dict[str, float]]] = {}
    for ranks in SCALES:
        job = Job(ranks, size_gb * GB, ranks_per_node, node_read_bps=node_read_gbps * GB, fs_aggregate_bps=fs_aggregate_gbps * GB)
        for path in PATHS:
            split = phases(job, m, path)
            total = sum(split.values())
            key = f"{ranks} ranks, {path}"
            details[key] = split
            parts = ", ".join(f"{k} {v:.2f}" for k, v in split.items())
            result.rows.append(Row(f"{key}: dominant phase {dominant(split)!r}", f"{total:.1f} s", parts))
        before = phases(job, BEFORE_16, "requeue", hash_on_one_node=True)
        details[f"{ranks} ranks, requeue, before #16"] = before
        result.rows.append(
            Row(
                f"{ranks} ranks, requeue, before #16 (cold ranks; `ckpt recover` imported torch and hashed every byte on one node)",
                f"{sum(before.values()):.1f} s",
                f"of which the check {before[CHECK]:.1f} s; dominant {dominant(before)!r}",
            )
        )
    result.notes.append(
        f"assumed storage: one node reads {node_read_gbps:g} GB/s, all nodes together {fs_aggregate_gbps:g} GB/s; "
        f"{ranks_per_node} ranks per node; {Job(8, 0).files_per_rank} files per rank; a stat {Job(8, 0).metadata_op_s * 1e3:g} ms, {Job(8, 0).stat_threads} at once; "
        f"a rendezvous join {Job(8, 0).rendezvous_per_node_s * 1e3:g} ms per node"
    )
    result.notes.append(
        "measured inputs (this machine, BENCHMARKS.md): "
        + ", ".join(f"{k} {v:g} s" for k, v in vars(m).items())
        + "; before #16: "
        + ", ".join(f"{k} {v:g} s" for k, v in vars(BEFORE_16).items())
    )
    result.details = details
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--size-gb", type=float, default=200.0)
    parser.add_argument("--node-read-gbps", type=float, default=2.0, help="one node's read bandwidth, GB/s (this VM: 1.2-2 cold)")
    parser.add_argument("--fs-aggregate-gbps", type=float, default=200.0, help="the shared filesystem's total, GB/s")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    args = parser.parse_args()
    model(args.size_gb, args.node_read_gbps, args.fs_aggregate_gbps, args.ranks_per_node).emit()


if __name__ == "__main__":
    main()
