"""A model of the time from a failure to the first resumed step, by phase, at any scale: the
model behind figure 13 (``bench/recovery_model.py``, its only user; no code of the package uses it).

Pure: the per-phase figures measured on one machine (BENCHMARKS.md figures 3, 8 and 9) and the
size of the job go in, seconds per phase come out. What grows with the job:

* the start's check of the newest checkpoint: hashing every byte on one node (``ckpt recover``
  before #16: bytes / one node's read bandwidth) or its structure only (one ``stat`` per file,
  16 at once: files x the filesystem's metadata latency / 16);
* the load: each node reads its share, bounded by its own bandwidth and by the filesystem's
  aggregate bandwidth shared by all nodes (the hashes are checked as the bytes land: no second
  read);
* the rendezvous: every agent joins one store (a per-node cost at the store host).

What does not grow: detection, the teardown, the new ranks' start (a pre-warmed spare in the
allocation; after a requeue, new interpreters importing torch on every node in parallel), one step.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
CHECK = "ckpt recover: check of the newest checkpoint"


@dataclass(frozen=True)
class Measured:
    """Per-phase seconds measured on this machine (defaults: BENCHMARKS.md, 2-rank recipe)."""

    detect_crash_s: float = 0.03  # figure 8 (2): SIGKILL -> rank_exited
    detect_hang_s: float = 5.02  # figure 8 (2): SIGSTOP -> hang (the step timeout, calibrated)
    teardown_s: float = 0.10  # figure 8 (4): hang -> the old ranks ended (SIGTERM, SIGKILL 0.5 s later at most)
    restart_s: float = 0.82  # figure 8 (4): -> first beat of the new ranks in the allocation (pre-warmed spares: no imports)
    cold_start_s: float = 5.83  # figure 9 (c): ckpt run start -> first beat on a fresh node (torchrun and the spare maker import torch)
    job_start_s: float = (
        2.2  # figure 9 (b)+(c): RUNNING -> job_start 0.56 + recover done -> ckpt run start 1.64 (scontrol, free-port, srun)
    )
    recover_fixed_s: float = 1.39  # figure 9 (c): job_start -> recover done (`ckpt nodes`, `ckpt recover` without torch)
    resume_fixed_s: float = 0.7  # figure 8 (4): resume() of the recipe's 2 MB checkpoint (plans, collectives, probe)
    step_s: float = 0.14  # figure 9 (c): one training step of the recipe


@dataclass(frozen=True)
class Job:
    """The job and its storage. Bandwidths are in bytes/s."""

    ranks: int
    checkpoint_bytes: float
    ranks_per_node: int = 8
    files_per_rank: int = 5  # io_threads DCP files + the rank's JSON state
    node_read_bps: float = 2.0 * GB  # one node's read bandwidth from the checkpoint's storage (NIC or disk)
    fs_aggregate_bps: float = 200.0 * GB  # the shared filesystem's total read bandwidth, all nodes together
    metadata_op_s: float = 0.0005  # one stat on the shared filesystem
    stat_threads: int = 16  # stats in flight at once (store.STAT_THREADS; the metadata server must keep up)
    rendezvous_per_node_s: float = 0.002  # one agent joining the rendezvous store

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)

    @property
    def files(self) -> int:
        return self.ranks * self.files_per_rank + 2  # + the DCP metadata and the manifest


def load_seconds(job: Job) -> float:
    """Every node reads its share at once: its own bandwidth or its part of the aggregate, the lower."""
    per_node = min(job.node_read_bps, job.fs_aggregate_bps / job.nodes)
    return job.checkpoint_bytes / job.nodes / per_node


def check_seconds(job: Job, hash_on_one_node: bool) -> float:
    """The start's check of the newest checkpoint: every byte hashed on one node, or its structure."""
    if hash_on_one_node:
        return job.checkpoint_bytes / min(job.node_read_bps, job.fs_aggregate_bps)
    return job.files * job.metadata_op_s / job.stat_threads


def phases(job: Job, m: Measured, path: str, hash_on_one_node: bool = False) -> dict[str, float]:
    """Seconds per phase from the failure to the first resumed step.

    ``path``: "crash" (SIGKILL, restarted in the allocation), "hang" (SIGSTOP, the same), or
    "requeue" (the job comes back through SLURM: job start, ``ckpt recover``, then the same
    restart; SLURM's own scheduling delay excluded)."""
    if path not in ("crash", "hang", "requeue"):
        raise ValueError(f"unknown path {path!r}: crash, hang or requeue")
    out: dict[str, float] = {}
    if path == "requeue":
        out["job start (srun, interpreters)"] = m.job_start_s
        out[CHECK] = m.recover_fixed_s + check_seconds(job, hash_on_one_node)
    else:
        out["detection"] = m.detect_crash_s if path == "crash" else m.detect_hang_s
        out["teardown"] = m.teardown_s
    out["new ranks: start, init, model"] = m.cold_start_s if path == "requeue" else m.restart_s
    out["rendezvous"] = job.nodes * job.rendezvous_per_node_s
    out["load (hash-checked as read)"] = m.resume_fixed_s + load_seconds(job)
    out["first step"] = m.step_s
    return out


def dominant(split: dict[str, float]) -> str:
    """The phase that takes the longest."""
    return max(split, key=lambda k: split[k])
