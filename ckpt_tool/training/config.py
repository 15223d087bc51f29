"""What a training run configures about its checkpoints, and what the manager asks of the
user's own objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ckpt_tool.core.anomaly import AnomalyPolicy
from ckpt_tool.core.retention import RetentionPolicy

DEFAULT_MAX_FAILED_SAVES = 3  # failed saves in a row that stop a run (each costs an interval without a checkpoint)
DEFAULT_IO_THREADS = 4  # DCP writer threads = files per rank (4 was fastest in bench/save_throughput.py)


class Stateful(Protocol):
    """Anything with ``state_dict()`` / ``load_state_dict()`` whose state is JSON-able data
    (numbers, strings, lists, dicts, small tensors): a sampler, a data loader's position."""

    def state_dict(self) -> dict[str, Any]:
        """The object's state as JSON-able data (saved in ``rank_R.state.json``)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state ``state_dict()`` returned (tuples may come back as lists)."""


@dataclass(frozen=True)
class CheckpointConfig:
    """How a run checkpoints. Every rank must pass the same values.

    Args:
        directory: the checkpoint directory (on a filesystem every rank sees); created by rank 0.
        save_every: ``maybe_save(step)`` saves when ``step % save_every == 0``; 0 saves only on
            explicit ``save()`` calls (and the final step, see ``save_final``).
        async_save: write in the background; only the copy to CPU memory blocks training.
        retention: which older checkpoints are deleted after each commit.
        validate_on_resume: check every file's size and hash as it is loaded.
        verify_on_resume: re-measure the probe after loading (needs ``probe=`` on the manager).
        max_fallbacks: damaged checkpoints quarantined and skipped at resume before giving up.
        exit_wait_s: how long ``close()``, exit and SIGTERM wait for an in-flight save.
        io_threads: DCP writer threads (files per rank), and files read at once by resume().
        cooperative_load: True: resume() reads each byte of the checkpoint once per job: every
            file by one rank, which hash-checks it and sends the items other ranks need over the
            manager's gloo group (a replicated entry is read once, not once per replica). False:
            every rank reads each file it needs something from, as torch's DCP does. None
            (default): ``$CKPT_COOPERATIVE_LOAD`` (1 or 0) when set, else cooperative when the
            ranks are on more than one node (SLURM's node name, else the host name): on one node
            the page cache already serves each byte from storage once, and copying it between the
            ranks over the loopback costs more than reading it (BENCHMARKS.md, figure 19).
        entry_point / entry_kwargs: ``"module:function"`` that builds the model for ``ckpt
            verify``, and the JSON keyword arguments it is called with (recorded in the manifest).
        max_failed_saves: a save that fails on the disk (full, read-only, permissions, I/O
            errors) is logged as a warning, its partial files removed, LATEST left alone, and
            retried at the next save; this many failures in a row raise ``CkptError`` with exit
            code 78 (``ExitCode.SAVE_FAILED``, not restarted by ``ckpt run``). 1: the first
            failure stops; 0: never stop. A failed final save (``close()``) or a failed save of
            a stop request always stops (there is no later save to retry at), unless 0.
        on_save_error: the older spelling: ``"stop"`` is ``max_failed_saves=1``, ``"continue"``
            is ``max_failed_saves=0``; None (default): ``max_failed_saves`` decides.
        take_over: write even if another live job owns the directory.
        quiet: no progress lines. By default rank 0 logs one line per commit (step, path, size,
            seconds) and one per resume (the step, its path, and why: the newest valid checkpoint
            or which newer ones it fell back past) on the ``ckpt_tool.progress`` logger, to stderr
            when the program configured no logging.
        save_final: ``close()`` saves the last step given to ``maybe_save()`` if it is not saved.
        owner_stale_after_s: an owning job not seen for this long is presumed dead.
        local_every: the fast tier: every this many steps (0: off) each rank saves its shards to
            a node-local directory and a peer rank on another node keeps a copy; a resume takes
            the newest step whose every rank's files are held somewhere, local or shared.
        local_dir: the node-local directory (tmpfs or NVMe); the environment variable
            ``CKPT_LOCAL_DIR`` overrides it per node. Default: ``/dev/shm/ckpt-USER-JOBID``.
        local_replicas: how many other nodes keep a copy of each rank's local checkpoint.
        local_keep: local steps kept per rank (older ones, and any not newer than the newest
            shared checkpoint, are deleted).
        anomaly: what a wrong value among the ``metrics`` given to ``maybe_save`` leads to (a NaN,
            an infinity, a spike above median + k x MAD of the last ``window`` values): ``"replay"``
            (default; under ``ckpt run``: back to the newest checkpoint, re-run the steps up to it
            and compare bit for bit: a transient hardware fault names its rank and training goes on
            from the replay; a reproducible NaN stops with exit 79), ``"stop"`` (exit 79 at once),
            ``"warn"`` (an event, training goes on); or a ``core.anomaly.AnomalyPolicy`` for the
            window and k. Nothing is checked for a run that gives no metrics.
        replica_check_every: the replicas of the model's replicated parameters (DDP, HSDP's
            ``dp_replicate``, what tensor parallel leaves whole) are compared before every save,
            so a checkpoint never holds replicas that disagree (a silent corruption); a positive
            N compares them every N steps too, 0 never. A disagreement is a wrong value like a
            NaN (``anomaly``). One small all-gather per check; nothing on one rank or plain FSDP.
        audit_every: every N-th save (0: never), before saving, the steps since the previous
            checkpoint are recomputed from it and every rank's values compared bit for bit (under
            ``ckpt run``: a restart and one save interval of compute, each time): a rank that
            computed other bits is a transient fault, named and charged, even when no value was
            wrong enough to be found (a corruption that never spikes); the replay's state is saved.
        on_reproducible_anomaly: called on every rank with the ``Verdict`` when a replay reproduced
            a spike (a NaN always stops): return ``"stop"`` to stop (exit 79), anything else goes
            on (the hook may skip data or lower the learning rate itself).

    Raises:
        ValueError: a value out of range (the message names it).
    """

    directory: Path | str
    save_every: int = 0
    async_save: bool = False
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    validate_on_resume: bool = True
    verify_on_resume: bool = True
    max_fallbacks: int = 3
    exit_wait_s: float = 120.0
    io_threads: int = DEFAULT_IO_THREADS
    cooperative_load: bool | None = None
    entry_point: str | None = None
    entry_kwargs: dict[str, Any] = field(default_factory=dict)
    max_failed_saves: int = DEFAULT_MAX_FAILED_SAVES
    on_save_error: str | None = None
    take_over: bool = False
    quiet: bool = False
    save_final: bool = True
    owner_stale_after_s: float = 300.0
    local_every: int = 0
    local_dir: Path | str | None = None
    local_replicas: int = 1
    local_keep: int = 2
    anomaly: AnomalyPolicy | str = "replay"
    replica_check_every: int | None = None
    audit_every: int = 0
    on_reproducible_anomaly: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.anomaly, str):
            object.__setattr__(self, "anomaly", AnomalyPolicy(mode=self.anomaly))  # ValueError names the modes
        elif not isinstance(self.anomaly, AnomalyPolicy):
            raise ValueError(f"anomaly must be 'replay', 'stop', 'warn' or an AnomalyPolicy, got {self.anomaly!r}")
        if self.replica_check_every is not None and (not isinstance(self.replica_check_every, int) or self.replica_check_every < 0):
            raise ValueError(
                f"replica_check_every must be None (at every save), 0 (never) or a positive integer, got {self.replica_check_every!r}"
            )
        if not isinstance(self.audit_every, int) or self.audit_every < 0:
            raise ValueError(f"audit_every must be a non-negative integer (saves between audits; 0: never), got {self.audit_every!r}")
        if self.on_reproducible_anomaly is not None and not callable(self.on_reproducible_anomaly):
            raise ValueError(f"on_reproducible_anomaly must be callable (it gets the Verdict), got {self.on_reproducible_anomaly!r}")
        if not isinstance(self.save_every, int) or self.save_every < 0:
            raise ValueError(f"save_every must be a non-negative integer, got {self.save_every!r}")
        if not isinstance(self.max_failed_saves, int) or self.max_failed_saves < 0:
            raise ValueError(
                f"max_failed_saves must be a non-negative integer (0: never stop for a failed save), got {self.max_failed_saves!r}"
            )
        if self.on_save_error is not None:
            if self.on_save_error not in ("stop", "continue"):
                raise ValueError(f"on_save_error must be 'stop' or 'continue', got {self.on_save_error!r}")
            # the older spelling of max_failed_saves (stop at the first failure, or never)
            meant = 1 if self.on_save_error == "stop" else 0
            if self.max_failed_saves not in (meant, DEFAULT_MAX_FAILED_SAVES):
                raise ValueError(
                    f"on_save_error={self.on_save_error!r} means max_failed_saves={meant}, but max_failed_saves={self.max_failed_saves!r} "
                    "was given: give only max_failed_saves"
                )
            object.__setattr__(self, "max_failed_saves", meant)
        if self.io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {self.io_threads!r}")
        for name in ("local_every", "local_replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(self.local_keep, int) or self.local_keep < 1:
            raise ValueError(f"local_keep must be an integer >= 1, got {self.local_keep!r}")
        if self.max_fallbacks < 0:
            raise ValueError(f"max_fallbacks must be >= 0, got {self.max_fallbacks!r}")
