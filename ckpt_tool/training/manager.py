"""The checkpoint manager a training loop calls: ``resume()`` once, ``maybe_save(step)`` every step.

It hides DCP, staging, hashing, the commit protocol, the pointer and retention::

    mgr = CheckpointManager(CheckpointConfig("ckpts", save_every=50, async_save=True),
                            model=model, optimizer=opt, scheduler=sched, data=sampler)
    start = mgr.resume() or 0          # the step to continue after (None: fresh start)
    for step in range(start + 1, total + 1):
        ...train one optimizer step...
        mgr.maybe_save(step)
    mgr.close()

Every rank calls every method (they are collective). Model and optimizer go through DCP
(sharded, FSDP2-aware, readable by torch's own tools); everything else a rank owns (RNG states,
scheduler, scaler, data position, user extras) goes into a per-rank JSON file, never a pickle.
"""

from __future__ import annotations

import atexit
import errno
import functools
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ckpt_tool.core import layout
from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.exactness import trajectory_differences
from ckpt_tool.core.manifest import FileEntry, Manifest, Probe
from ckpt_tool.core.ownership import Owner
from ckpt_tool.core.recovery import fallback_step
from ckpt_tool.core.reshard import ReshardPlan, plan_resume
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import RESTART_CANNOT_HELP, CkptError, ExitCode
from ckpt_tool.store.checksums import binding_seed
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import rng, state_codec
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.commit import commit_staged
from ckpt_tool.training.hashing_fs import HashingFileSystem
from ckpt_tool.training.heartbeat import heartbeat
from ckpt_tool.training.probe import ProbeSpec, check_loaded_model, current_env, measure
from ckpt_tool.training.safe_dcp import dcp_failures, load_state
from ckpt_tool.training.validation import validate_checkpoint

log = logging.getLogger("ckpt_tool")
OWNER_REFRESH_S = 30.0  # how often the writing job says it is alive (one small write)
DEFAULT_IO_THREADS = 4  # DCP writer threads = files per rank (4 was fastest in bench/save_throughput.py)


F = TypeVar("F", bound=Callable[..., Any])


def _reports_fatal(method: F) -> F:
    """A ``CkptError`` a restart cannot fix (bad configuration, a checkpoint that does not fit)
    is told to ``ckpt run`` before it is raised, so the job stops at once with the rank's
    message instead of being restarted into the same error."""

    @functools.wraps(method)
    def wrapper(self: "CheckpointManager", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except CkptError as exc:
            if exc.exit_code in RESTART_CANNOT_HELP:
                self.hb.fatal(exc.exit_code, str(exc))
            raise

    return wrapper  # type: ignore[return-value]


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class CheckpointConfig:
    directory: Path | str
    save_every: int = 0  # 0: only explicit save() calls
    async_save: bool = False
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    validate_on_resume: bool = True  # hash-check the checkpoint before loading it
    verify_on_resume: bool = True  # re-measure the probe after loading (needs probe=)
    max_fallbacks: int = 3  # damaged checkpoints skipped on resume before giving up
    exit_wait_s: float = 120.0  # how long exit / SIGTERM waits for an in-flight save
    io_threads: int = DEFAULT_IO_THREADS
    entry_point: str | None = None  # "module:function" that builds the model for `ckpt verify`
    entry_kwargs: dict[str, Any] = field(default_factory=dict)  # JSON keyword arguments for it
    test_commit_delay_s: float = 0.0  # test hook: a slow filesystem between write and commit
    # A save that fails (disk full, permissions): "stop" raises CkptError (the default: a run that
    # cannot checkpoint trains without a safety net); "continue" logs it and trains on.
    on_save_error: str = "stop"
    take_over: bool = False  # write even if another live job owns the directory
    save_final: bool = True  # close() saves the last step passed to maybe_save() unless it is saved
    owner_stale_after_s: float = 300.0  # an owner not seen for this long is presumed dead

    def __post_init__(self) -> None:
        if not isinstance(self.save_every, int) or self.save_every < 0:
            raise ValueError(f"save_every must be a non-negative integer, got {self.save_every!r}")
        if self.on_save_error not in ("stop", "continue"):
            raise ValueError(f"on_save_error must be 'stop' or 'continue', got {self.on_save_error!r}")
        if self.io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {self.io_threads!r}")


class CheckpointManager:
    def __init__(
        self,
        config: CheckpointConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None = None,
        scaler: Any | None = None,
        data: Stateful | None = None,
        probe: ProbeSpec | None = None,
        batch: BatchConfig | None = None,
        parallelism: dict[str, int] | None = None,
    ) -> None:
        self.config = config
        self.model, self.optimizer, self.scheduler, self.scaler, self.data = model, optimizer, scheduler, scaler, data
        self.probe_spec = probe
        self.batch = batch
        self.hb = heartbeat()
        self.hb.beat(0, "init")  # the supervisor knows this rank from now on (resume may take long)
        self.comm = Comm(with_control=self.hb.active)
        self.parallelism = parallelism or {"dp_shard": self.comm.world_size}
        self.store = self._open_store(Path(config.directory))
        exported = os.environ.get("CKPT_DIR")
        if exported and self.comm.is_coordinator and Path(exported).resolve() != self.store.root.resolve():
            log.warning("ckpt: CKPT_DIR is %s (set by `ckpt run`/`ckpt submit`) but this run saves to %s: `ckpt status` and `ckpt recover` look in CKPT_DIR", exported, self.store.root)
        self.run_id: str | None = None
        self.extra: dict[str, Any] = {}  # user extras restored by resume()
        self.last_saved_step: int | None = None
        self._last_step: int | None = None  # the last step maybe_save() saw (the final save's step)
        self._last_extra: dict[str, Any] | None = None
        self._model_differs = False  # the last load left checkpoint entries of the model unused
        self._plan: ReshardPlan | None = None  # set when resume() reshards
        self._owner_since: float | None = None  # set when rank 0 claimed the directory
        self._claimed = False
        self._owner_stop = threading.Event()  # ends the thread that keeps the claim alive
        self._owner_thread: threading.Thread | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-commit")
        self._inflight: Future | None = None
        self._staging: Future | None = None
        self._stager = None
        self._closed = False
        self._lock = threading.Lock()
        optimizer.register_step_pre_hook(lambda *_: self.wait_for_staging())
        atexit.register(self._close_at_exit)
        if threading.current_thread() is threading.main_thread():
            self._previous_term = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _open_store(self, directory: Path) -> CheckpointStore:
        """Rank 0 creates the directory; every rank learns whether that worked."""

        def create() -> None:
            CheckpointStore(directory, create=True)

        self.comm.on_coordinator(create)
        return CheckpointStore(directory)

    # ------------------------------------------------------------------ environment
    def _env(self) -> dict[str, Any]:
        return current_env(self.model, self.comm.world_size)

    # ------------------------------------------------------------------ resume
    @_reports_fatal
    def resume(self) -> int | None:
        """Load the newest valid checkpoint; returns its step, or None on a fresh start.

        A damaged newest checkpoint (hash or structure) is quarantined and the previous one
        used, up to ``max_fallbacks`` times. Collective: every rank calls it.
        """
        self.wait()
        self._claim_directory()
        for action in self.comm.on_coordinator(lambda: self.store.clean_up_after_crash(roll_forward=lambda s: validate_checkpoint(self.store, s).ok)):
            log.warning("ckpt: %s", action)
        for _ in range(self.config.max_fallbacks + 1):
            candidate = self.comm.on_coordinator(self._candidate)
            if candidate is None:
                self.hb.beat(0, "step")
                return None
            problems = self._check_structure(candidate)
            if not problems:
                problems = self._load(candidate)
            if not problems:
                problems = self._verify_loaded(candidate)
            if not problems:
                self.hb.resumed(candidate)
                self.hb.beat(candidate, "step")
                return candidate
            if self.comm.is_coordinator:
                self._fall_back(candidate, problems)
            self.comm.barrier()
        raise CkptError(
            f"no valid checkpoint in {self.store.root}: the newest {self.config.max_fallbacks + 1} were damaged and quarantined",
            f"inspect {self.store.quarantine_root} and the index; run `ckpt validate --all`",
            ExitCode.NOT_FOUND,
        )

    def _owner(self) -> Owner:
        now = time.time()
        return Owner(os.environ.get("SLURM_JOB_ID"), socket.gethostname(), os.getpid(), self._owner_since or now, now)

    def _claim_directory(self) -> None:
        """One job writes a directory at a time (rank 0 claims it; every rank learns the outcome)."""

        def claim() -> None:
            self._owner_since = time.time()
            reason = self.store.claim(self._owner(), self.config.owner_stale_after_s, self.config.take_over)
            if reason.startswith("stale") or reason.startswith("take-over"):
                log.warning("ckpt: taking over %s (%s)", self.store.root, reason)
            if self._owner_thread is None:
                self._owner_thread = threading.Thread(target=self._keep_owner_alive, name="ckpt-owner", daemon=True)
                self._owner_thread.start()

        self.comm.on_coordinator(claim)
        self._claimed = True  # on every rank: later saves need not ask again

    def _keep_owner_alive(self) -> None:
        """Rank 0, in a thread: refresh the claim every ``OWNER_REFRESH_S`` whatever the training
        loop does (a long evaluation must not make the job look dead). When another job took the
        directory over, say so once: the next commit is refused (see ``CheckpointStore.commit``)."""
        while not self._owner_stop.wait(OWNER_REFRESH_S):
            try:
                self.store.refresh_owner(self._owner())
            except CkptError as exc:
                log.error("ckpt: %s", exc)
                return
            except OSError as exc:  # a flaky shared filesystem must not stop training
                log.warning("ckpt: could not refresh %s: %s", self.store.root, exc)

    def _candidate(self) -> int | None:
        try:
            latest = self.store.read_latest()
            if latest is not None and (self.store.step_path(latest) / layout.MANIFEST_NAME).is_file():
                return latest
            if latest is None and not self.store.committed_on_disk():
                return None
            reason = "LATEST names a missing checkpoint" if latest is not None else "LATEST is missing"
        except CkptError as exc:
            reason = exc.message
        step = fallback_step(self.store.committed_on_disk(), None)
        if step is None:
            raise CkptError(f"{reason} and no committed checkpoint is left in {self.store.root}", "start the run from scratch in a new directory, or restore from quarantine/", ExitCode.NOT_FOUND)
        log.warning("ckpt: %s; falling back to step %d", reason, step)
        self.store.set_latest(step, reason)
        return step

    def _check_structure(self, step: int) -> list[str]:
        """Rank 0 checks the files are all there with their sizes and the DCP metadata is safe
        to read; the hashes are checked as the files are loaded (one read of the data). Damage
        is returned as problems; what is not damage (a newer format, files this user may not
        read) is raised on every rank."""
        if not self.config.validate_on_resume:
            return []

        def check() -> list[str]:
            result = validate_checkpoint(self.store, step, hashes=False)
            if result.unreadable and not result.problems:
                raise self.store.permission_denied(self.store.step_path(step) / result.unreadable[0])
            return [str(p) for p in result.problems]

        try:
            return self.comm.on_coordinator(check)
        except CkptError as exc:
            if exc.exit_code == ExitCode.FAILED:
                return [exc.message]
            raise CkptError(f"checkpoint step {step}: {exc.message}", exc.hint, exc.exit_code) from None

    def _verify_loaded(self, step: int) -> list[str]:
        """The probe checks on the freshly loaded state (``ckpt verify`` in-process)."""
        if not self.config.verify_on_resume or self.probe_spec is None or self.store.read_manifest(step).probe is None:
            return []
        if self._model_differs:  # the probe measures the saved model; this one has other parts
            log.warning("ckpt: the probe check of step %d is skipped: this run's model is not the one that saved it", step)
            return []
        try:
            report = check_loaded_model(self.model, self.probe_spec.loss_fn, self.store, step, self.comm.world_size, self.comm.group)
            problems = [f"verify {c.name}: recorded {c.recorded!r}, measured {c.measured!r} ({c.how})" for c in report.checks if not c.ok]
        except (CkptError, OSError) as exc:
            problems = [f"verify: {getattr(exc, 'message', exc)}"]
        return sorted({p for rank_problems in self.comm.all_gather(problems) for p in rank_problems})

    def _fall_back(self, bad: int, problems: list[str]) -> None:
        reason = "; ".join(problems[:5])
        log.error("ckpt: checkpoint step %d is damaged (%s): quarantining it", bad, reason)
        self.store.quarantine(bad, reason)
        previous = fallback_step(self.store.committed_on_disk(), bad)
        if previous is not None:
            self.store.set_latest(previous, f"step {bad} damaged: {reason}")

    def _load(self, step: int) -> list[str]:
        """Load model, optimizer and this rank's state, every file hash-checked as it is read.
        Returns the problems that make this checkpoint unusable (the same on every rank)."""
        path = self.store.step_path(step)
        manifest = self.store.read_manifest(step)
        resharded = manifest.world_size != self.comm.world_size
        if resharded:
            self._plan_reshard(manifest)
        for why in trajectory_differences(manifest.env, self._env()):
            log.warning("ckpt: resume from step %d will not be bit-identical: %s", step, why)
        verify_fs = HashingFileSystem(lambda name: binding_seed(manifest.run_id, step, name), {f.path: f for f in manifest.files})
        problems: list[str] = []
        mismatch: CkptError | None = None
        if not self.optimizer.state:
            # torch builds the empty optimizer state DCP loads into only when no parameter has a
            # gradient; with gradients present it returns no optimizer state and the checkpoint's
            # would be skipped without a word. Gradients from before a resume are stale anyway.
            self.optimizer.zero_grad(set_to_none=True)
        try:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            unused = load_state(state, path, process_group=self.comm.group, no_dist=not self.comm.distributed, verify_with=verify_fs)
            not_loaded = [k for k in unused if k.split(".", 1)[0] in state]  # the probe batch is verify's
            self._model_differs = any(k.startswith("model.") for k in not_loaded)
            if not_loaded and self.comm.is_coordinator:
                log.warning("ckpt: %d entries of checkpoint step %d were not loaded, the model or optimizer differs from the saved one: %s", len(not_loaded), step, ", ".join(not_loaded[:5]) + (", ..." if len(not_loaded) > 5 else ""))
            rank_state = self._read_rank_state(path, verify_fs, manifest.world_size)
        except CkptError as exc:
            if exc.exit_code != ExitCode.FAILED:  # not damage: does not fit the run, not readable by this user
                mismatch = exc
            problems = [exc.message]
        gathered = self.comm.all_gather((problems, mismatch))
        conflicts = [m for _, m in gathered if m is not None]
        if conflicts:  # not damage: no quarantine, no fallback to an older checkpoint
            raise CkptError(f"checkpoint step {step}: {conflicts[0].message}", conflicts[0].hint, conflicts[0].exit_code)
        problems = sorted({p for rank_problems, _ in gathered for p in rank_problems})
        if problems:
            return problems
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self._restore_rank_state(rank_state)
        self.run_id = manifest.run_id
        self.last_saved_step = step
        if resharded and self.comm.is_coordinator:
            self.store.append_event("reshard", step=step, from_world_size=manifest.world_size, to_world_size=self.comm.world_size, batch=self._plan.to_json())
        log.info("ckpt: resumed from %s (step %d)", path, step)
        return []

    def _plan_reshard(self, manifest: Manifest) -> None:
        """A different world size: the one plan (``core.reshard.plan_resume``, the same ``ckpt
        recover`` reports) keeps the global batch and never changes it silently."""
        plan = plan_resume(manifest.batch, manifest.world_size, manifest.lineage, self.comm.world_size, requested=self.batch)
        self._plan = plan
        self.batch = plan.new
        log.warning(
            "ckpt: resharding step %d from %d to %d ranks: micro-batch %d x grad accumulation %d (was %d x %d), global batch %d kept",
            manifest.step, manifest.world_size, self.comm.world_size, plan.new.micro_batch, plan.new.grad_accum, plan.old.micro_batch, plan.old.grad_accum, plan.new.global_batch,
        )

    def _read_rank_state(self, path: Path, verify_fs: HashingFileSystem, saved_world: int) -> dict[str, Any]:
        """This rank's JSON state. After a reshard: the job-wide parts (data position, scheduler,
        counters, extras) from rank 0, whose values every rank shares; the RNG of old rank
        ``rank % saved_world`` (a reshard is not bit-exact anyway)."""
        def read(rank: int) -> dict[str, Any]:
            f = path / layout.rank_state_name(rank)
            return state_codec.loads(verify_fs.read_verified(f), str(f))

        if saved_world == self.comm.world_size:
            return read(self.comm.rank)
        state = read(0)
        state["rng"] = read(self.comm.rank % saved_world)["rng"]
        return state

    def _restore_rank_state(self, state: dict[str, Any]) -> None:
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        self.extra = state.get("extra") or {}
        rng.restore(state["rng"])

    # ------------------------------------------------------------------ save
    @_reports_fatal
    def maybe_save(self, step: int, extra: dict[str, Any] | None = None) -> bool:
        """Call once per optimizer step: beats the heartbeat, saves every ``save_every`` steps,
        and, when ``ckpt run`` asked for it (preemption, time limit), saves now and exits the
        process with status 0 once the checkpoint is committed (``ckpt run`` then exits "requeue")."""
        self.hb.beat(step, "step")
        self._last_step, self._last_extra = step, extra
        stop = self.hb.active and self.comm.any_rank(self.hb.stop_requested())
        saved = False
        if stop or (self.config.save_every and step % self.config.save_every == 0):
            self.save(step, extra)
            saved = True
        if stop:
            self.close()
            self.hb.send_event("stopped", step=step)
            log.warning("ckpt: checkpoint of step %d committed on request; stopping for requeue", step)
            raise SystemExit(0)
        return saved

    @_reports_fatal
    def save(self, step: int, extra: dict[str, Any] | None = None) -> None:
        """Checkpoint the state after optimizer step ``step``. Collective.

        Sync: returns when the checkpoint is committed. Async: returns once staging has started;
        the copy to CPU memory must finish before the next optimizer step (a step pre-hook
        waits for it); writing, hashing and committing run in the background.
        """
        if self._closed:
            raise CkptError("save() after close()", "create a new CheckpointManager")
        with self.hb.phase("checkpoint"):
            self._save(step, extra)

    def _check_step_grows(self, step: int) -> None:
        """Refuse a save behind the newest checkpoint: LATEST would move back, and the next start
        would roll forward to the newer-numbered (older) checkpoint. The same step again is a
        supersede (the old one is quarantined). Before the first save or resume, the directory
        is asked (one listing, on rank 0)."""
        newest = self.last_saved_step
        if newest is None:
            newest = self.comm.broadcast(self._newest_in_directory() if self.comm.is_coordinator else None)
        if newest is not None and step < newest:
            raise CkptError(
                f"save({step}): {self.store.root} already holds checkpoint step {newest}; steps must not go back",
                "call resume() before training to continue from it, use a new directory for a new run, or `ckpt rollback --to N` first to go back on purpose",
                ExitCode.USAGE,
            )

    def _newest_in_directory(self) -> int | None:
        """The highest step LATEST or a committed directory names (one listing)."""
        latest = self.store.latest_or_none()
        return max([*self.store.committed_on_disk(), *([] if latest is None else [latest])], default=None)

    def _save(self, step: int, extra: dict[str, Any] | None) -> None:
        self.wait()  # at most one save in flight
        if not self._claimed:
            self._claim_directory()  # a script that saves without resume() first
        self._check_step_grows(step)
        if self.run_id is None:
            self.run_id = self.comm.broadcast(uuid.uuid4().hex[:16] if self.comm.is_coordinator else None)
        lr = float(self.optimizer.param_groups[0]["lr"])
        probe = measure(self.model, self.probe_spec, lr, step) if self.probe_spec is not None else None
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if self.probe_spec is not None:
            state["probe"] = self.probe_spec.batch
        rank_json = state_codec.dumps(self._rank_state(step, extra))
        partial = self.store.partial_path(step)
        if not self.store.root.is_dir():  # never recreate it: that would start a new, empty history
            self._handle_save_error(CkptError(f"checkpoint directory {self.store.root} vanished (unmounted or deleted?)", "restore or remount it; the previous checkpoints are wherever it went", ExitCode.FAILED))
            return
        try:
            partial.mkdir(exist_ok=True)
        except OSError as exc:
            self._handle_save_error(self._save_failed(step, exc))
            return
        writer = FileSystemWriter(partial, single_file_per_rank=True, sync_files=True, thread_count=self.config.io_threads, overwrite=True)
        run_id = self.run_id
        writer.fs = HashingFileSystem(lambda name: binding_seed(run_id, step, name))  # hashes as it writes
        commit_args = (writer.fs, step, rank_json, probe, time.time(), self._env())
        if self.config.async_save:
            response = dcp.async_save(
                state,
                storage_writer=writer,
                process_group=self.comm.group,
                async_stager=self._get_stager(),
                no_dist=not self.comm.distributed,
            )
            self._staging = response.staging_completion
            self._inflight = self._executor.submit(self._finish, response.upload_completion, *commit_args)
        else:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.comm.group, no_dist=not self.comm.distributed)
            except (CheckpointException, OSError) as exc:
                self._handle_save_error(self._save_failed(step, exc))
                return
            try:
                self._finish(None, *commit_args)
            except CkptError as exc:
                self._handle_save_error(exc)
                return
        self.last_saved_step = step

    def _save_failed(self, step: int, exc: BaseException) -> CkptError:
        """Remove the staging directory of a failed save and say why, with the space involved."""
        if self.comm.is_coordinator:
            shutil.rmtree(self.store.partial_path(step), ignore_errors=True)
        if isinstance(exc, CkptError) and exc.exit_code == ExitCode.CONFLICT:  # not a disk problem
            return CkptError(f"saving step {step} failed: {exc.message}", exc.hint, exc.exit_code)
        cause = _root_os_error(exc)
        latest = self.store.latest_or_none()
        hint = f"the previous checkpoint (step {latest}) is intact and the partial files were removed" if latest is not None else "no checkpoint was committed yet; the partial files were removed"
        if cause is not None and cause.errno == errno.ENOSPC:
            free = shutil.disk_usage(self.store.root).free
            needed = self.store.read_manifest(latest).total_bytes if latest is not None else None
            need = f"a checkpoint takes about {needed} bytes" if needed else "the state did not fit"
            return CkptError(f"saving step {step} failed: no space left on device in {self.store.root} ({free} bytes free; {need})", f"free space there or move --ckpt-dir; {hint}", ExitCode.FAILED)
        detail = f"{type(cause or exc).__name__}: {cause or exc}".splitlines()[0]
        return CkptError(f"saving step {step} to {self.store.root} failed: {detail}", hint, ExitCode.FAILED)

    def _handle_save_error(self, error: CkptError) -> None:
        """``on_save_error="stop"`` (default): raise; ``"continue"``: log and train on."""
        if self.config.on_save_error == "continue":
            log.error("ckpt: %s (training continues without this checkpoint: %s)", error.message, error.hint)
            return
        raise error

    def _get_stager(self) -> Any:
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: PLC0415 (async only)

            accel = torch.cuda.is_available()
            # One staging buffer, cached and reused across saves; pinned + non-blocking on GPUs.
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=accel, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=accel))
        return self._stager

    def _rank_state(self, step: int, extra: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "step": step,
            "rng": rng.capture(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "data": self.data.state_dict() if self.data is not None else None,
            "extra": extra or {},
        }

    def _finish(self, upload: Future | None, fs: HashingFileSystem, step: int, rank_json: bytes, probe: Probe | None, created_at: float, env: dict[str, Any]) -> None:
        """Per-rank file + hashes, gathered; rank 0 writes the manifest and commits."""
        if upload is not None:
            try:
                upload.result()
            except (CheckpointException, OSError) as exc:
                raise self._save_failed(step, exc) from None
        if self.config.test_commit_delay_s:
            time.sleep(self.config.test_commit_delay_s)
        assert self.run_id is not None
        run_id = self.run_id

        def make_manifest(files: tuple[FileEntry, ...]) -> Manifest:
            return Manifest(
                run_id=run_id,
                step=step,
                created_at=created_at,
                world_size=self.comm.world_size,
                files=files,
                batch=self.batch,
                parallelism=self.parallelism,
                env=env,
                probe=probe,
                entry_point=self.config.entry_point,
                entry_kwargs=self.config.entry_kwargs,
            )

        try:
            commit_staged(self.store, self.comm, step, run_id, fs, rank_json, make_manifest, self.config.retention)
        except (CkptError, OSError) as exc:
            raise self._save_failed(step, exc) from None
        self.hb.checkpoint_committed(step)

    # ------------------------------------------------------------------ waiting and shutdown
    def wait_for_staging(self) -> None:
        staging, self._staging = self._staging, None
        if staging is not None:
            staging.result()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the in-flight save (staging and commit); re-raise its failure."""
        self.wait_for_staging()
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            try:
                inflight.result(timeout=timeout)
            except CkptError as exc:
                self._handle_save_error(exc)

    @_reports_fatal
    def close(self, timeout: float | None = None, final: bool | None = None) -> None:
        """Save the final step (``save_final``, unless ``final=False``), wait for the in-flight
        save and release the manager's resources. Collective. No final save while an exception
        is propagating (the state may be half-way through a step) or at interpreter exit."""
        with self._lock:
            if self._closed:
                return
        want_final = self.config.save_final if final is None else final
        if want_final and self._last_step is not None and self._last_step != self.last_saved_step and sys.exc_info()[0] is None:
            self.save(self._last_step, self._last_extra)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.wait(timeout=self.config.exit_wait_s if timeout is None else timeout)
        finally:
            self._owner_stop.set()
            self._executor.shutdown(wait=False)
            if self._stager is not None:
                self._stager.close()
            self.comm.close()
            atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        self.close(final=False)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM under ``ckpt run`` (preemption: SLURM signals every process): checkpoint at the
        next step and stop, as if the supervisor had asked. Otherwise: let an in-flight save
        commit (up to ``exit_wait_s``), then die as SIGTERM would."""
        if self.hb.active:
            self.hb.request_stop()
            return
        try:
            self.close(final=False)
        except BaseException as exc:  # noqa: BLE001 - dying anyway; say why the save was lost
            log.error("ckpt: in-flight save lost at SIGTERM: %s", exc)
        signal.signal(signal.SIGTERM, self._previous_term if callable(self._previous_term) else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _root_os_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failure, looking through DCP's CheckpointException and chains."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        if isinstance(e, CheckpointException):
            todo += dcp_failures(e)
        todo += [e.__cause__, e.__context__]
    return None
