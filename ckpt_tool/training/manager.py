"""The checkpoint manager a training loop calls: ``resume()`` once, ``maybe_save(step)`` every step.

It hides DCP, staging, hashing, the commit protocol, the pointer and retention::

    mgr = CheckpointManager(CheckpointConfig("ckpts", save_every=50, async_save=True),
                            model=model, optimizer=opt, scheduler=sched, data=sampler)
    start = mgr.resume() or 0          # the step to continue after (None: fresh start)
    for step in range(start + 1, total + 1):
        ...train one optimizer step...
        mgr.maybe_save(step, metrics={"loss": loss.item(), "grad_norm": norm.item()})
    mgr.close()

The ``metrics`` (optional, each rank its own values) are recorded and checked for wrong numbers
(``training.anomaly_watch``, ``core.anomaly``): under ``ckpt run`` a NaN or a spike sends every
rank back to the newest checkpoint to replay the steps up to it and tell a hardware fault (the
replay differs: its rank is named, training goes on from the replay) from the data (it does not).

Every rank calls every method (they are collective). Model and optimizer go through DCP
(sharded, FSDP2-aware, readable by torch's own tools); everything else a rank owns (RNG states,
scheduler, scaler, data position, user extras) goes into a per-rank JSON file, never a pickle.

The work is done by collaborators, one per concern: ``DirectoryClaim`` (one writer per
directory), ``Resumption`` (resume), ``Saver`` (save and commit); this class wires them to the
process: the heartbeat, an optimizer hook, SIGTERM, exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from ckpt_tool.core.anomaly import FINGERPRINT, Anomaly, judge_replay, plan_anomaly
from ckpt_tool.core.batch import BatchConfig, BatchRequest
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.core.reshard_plan import ReshardPlan
from ckpt_tool.errors import RESTART_CANNOT_HELP, CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import progress, state_codec
from ckpt_tool.training.anomaly_watch import AnomalyWatch, as_floats
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.config import CheckpointConfig, Stateful
from ckpt_tool.training.directory_claim import DirectoryClaim
from ckpt_tool.training.heartbeat import Heartbeat, heartbeat
from ckpt_tool.training.local_tier import LocalTier
from ckpt_tool.training.mesh import run_mesh
from ckpt_tool.training.probe import ProbeSpec, current_env
from ckpt_tool.training.rank_state import TrainingState
from ckpt_tool.training.replicas import ReplicaCheck, StateFingerprints, digest
from ckpt_tool.training.resume import Resumed, Resumption
from ckpt_tool.training.saver import Saver

__all__ = ["CheckpointConfig", "CheckpointManager", "Stateful"]

log = logging.getLogger("ckpt_tool")
ENV_REPLAY_UNTIL = "CKPT_REPLAY_UNTIL"  # set by `ckpt replay`: the last step to run (then the process exits 0)
ENV_REPLAY_FROM = "CKPT_REPLAY_FROM"  # ... and the step it replays from: nothing else may be loaded
F = TypeVar("F", bound=Callable[..., Any])


def _reports_fatal(method: F) -> F:
    """A ``CkptError`` a restart cannot fix (bad configuration, a checkpoint that does not fit)
    is told to ``ckpt run`` before it is raised, so the job stops at once with the rank's
    message instead of being restarted into the same error."""

    @functools.wraps(method)
    def wrapper(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except CkptError as exc:
            if exc.exit_code in RESTART_CANNOT_HELP:
                self.hb.fatal(exc.exit_code, str(exc))
            raise

    return wrapper  # type: ignore[return-value]


class CheckpointManager:
    """Checkpoints of one training run in ``config.directory``. Collective: every rank makes
    one and calls every method.

    Args:
        config: how to checkpoint (``CheckpointConfig``).
        model, optimizer: saved and loaded through DCP (FSDP2-sharded or not).
        scheduler, scaler, data: anything with ``state_dict()``/``load_state_dict()``; saved per
            rank as JSON (the data position must be JSON-able).
        probe: a fixed batch and loss function; its loss and gradient norm are recorded at save
            and re-measured at resume and by ``ckpt verify``.
        batch: how the global batch is formed; lets a resume on another mesh keep it. Its
            data-parallel size is the mesh's (``mesh.dp_size``), not the world size.
        mesh: the run's device mesh: a torch ``DeviceMesh`` whose dimensions are named
            (``dp_shard``/``dp``, ``tp``, ...: ``core.mesh.DIMENSIONS``), or a ``ckpt_tool.Mesh``
            or a mapping of sizes. Default: a 1-D FSDP mesh of all ranks. Recorded in the manifest;
            a resume on another mesh is planned from it. ``parallelism`` (``{"dim": size}``) is
            the older spelling.
        must_divide: what the mesh sizes must divide, e.g. ``{"tp": {"attention heads": 32}}``:
            recorded with the mesh; a resume or reshard onto sizes that break it is refused.
        comm, hb: the collectives and the heartbeat (default: made here; tests pass fakes).
        before_commit: called with the step in the save's thread after the files are written
            and before the commit (tests use it to widen that window).

    Raises:
        CkptError: the directory cannot be created (exit 2); later methods raise it too, see each.
    """

    def __init__(
        self,
        config: CheckpointConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None = None,
        scaler: Any | None = None,
        data: Stateful | None = None,
        probe: ProbeSpec | None = None,
        batch: BatchConfig | BatchRequest | None = None,
        mesh: Any = None,
        parallelism: dict[str, int] | None = None,
        must_divide: dict[str, dict[str, int]] | None = None,
        *,
        comm: Comm | None = None,
        hb: Heartbeat | None = None,
        before_commit: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        device_mesh = mesh if hasattr(mesh, "mesh_dim_names") else None
        self.state = TrainingState(model, optimizer, scheduler, scaler, data, device_mesh)
        self.probe_spec = probe
        self.hb = hb or heartbeat()
        self.hb.beat(0, "init")  # the supervisor knows this rank from now on (resume may take long)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.replicas = ReplicaCheck(model, world, config.replica_check_every)
        # the control group: the main thread's agreement (the step's sync under ckpt run, the replica
        # check) while an async save's collectives run on the manager's group in the background
        self.comm = comm or Comm(with_control=self.hb.active or bool(self.replicas.params))
        self.hb.timer.rank, self.hb.timer.world_size = self.comm.rank, self.comm.world_size  # its slots in the step sync
        self.store = self._open_store(Path(config.directory))
        exported = os.environ.get("CKPT_DIR")
        replay_until = os.environ.get(ENV_REPLAY_UNTIL)
        self.replay_until = int(replay_until) if replay_until else None  # under `ckpt replay`: its last step
        if self.replay_until is not None and (not exported or Path(exported).resolve() != self.store.root.resolve()):
            raise CkptError(
                f"ckpt replay runs this script on a copy in {exported}, but it saves to {self.store.root}: the replay would write there",
                "give the checkpoint directory from $CKPT_DIR (or --ckpt-dir, which ckpt replay points at its copy), or replay with -- COMMAND",
                ExitCode.USAGE,
            )
        if exported and self.comm.is_coordinator and Path(exported).resolve() != self.store.root.resolve():
            log.warning(
                "ckpt: CKPT_DIR is %s (set by `ckpt run`/`ckpt submit`) but this run saves to %s: `ckpt status` and `ckpt recover` look in CKPT_DIR",
                exported,
                self.store.root,
            )
        if self.comm.is_coordinator and not config.quiet:
            progress.enable()
        self.claim = DirectoryClaim(self.store, self.comm, config.owner_stale_after_s, config.take_over)
        self.mesh: Mesh = run_mesh(mesh if mesh is not None else parallelism, self.comm.world_size, must_divide)
        env = lambda: current_env(model, self.mesh)  # noqa: E731
        self.saver = Saver(config, self.state, probe, self.store, self.comm, self.hb, env, self.mesh, before_commit)
        self.local = (
            LocalTier(config, self.store.root, self.comm, self.mesh, env, self.store.append_event, probe) if config.local_every else None
        )
        self.request = BatchRequest.of(batch)
        self._batch_error: CkptError | None = None
        try:  # a fresh start's split; a resume re-plans it from the checkpoint
            self.saver.batch = self.request.resolve(self.mesh.dp_size) if self.request is not None else None
        except CkptError as exc:  # e.g. --global-batch 12 --micro-batch 3 on 3 ranks: a resume may still plan it
            self._batch_error = exc
        self._env = env
        run_dir = Path(os.environ.get("CKPT_RUN_DIR") or self.store.root / "run")
        assert not isinstance(config.anomaly, str)  # CheckpointConfig made it a policy
        # a replay under `ckpt replay` records its values to compare them; what they say is its report
        policy = dataclasses.replace(config.anomaly, mode="warn") if self.replay_until is not None else config.anomaly
        self.anomalies = AnomalyWatch(run_dir, self.comm.rank, policy)
        # an audit names the rank whose own state changed first: its shards' fingerprints, each step
        self.state_prints = StateFingerprints(model, optimizer) if config.audit_every else None
        self.extra: dict[str, Any] = {}  # user extras restored by resume()
        self.plan: ReshardPlan | None = None  # set when resume() resharded
        self._last_step: int | None = None  # the last step maybe_save() saw (the final save's step)
        self._last_extra: dict[str, Any] | None = None
        self._local_step: int | None = None  # the newest fast-tier save this process started or resumed from
        self._closed = False
        self._lock = threading.Lock()
        optimizer.register_step_pre_hook(lambda *_: self.wait_for_staging())
        atexit.register(self._close_at_exit)
        if threading.current_thread() is threading.main_thread():
            self._previous_term = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # ------------------------------------------------------------------ what the run reads
    @property
    def batch(self) -> BatchConfig | None:
        """The batch split to train with: after a resume, the plan for this world size (the
        checkpoint's global batch, unless the run gave another one explicitly); on a fresh start
        the one asked for. None when no batch was given.

        Raises:
            CkptError: on a fresh start, when the split asked for does not fit this world size (exit 2).
        """
        if self.saver.batch is None and self._batch_error is not None:
            raise self._batch_error
        return self.saver.batch

    @property
    def run_id(self) -> str | None:
        """The run's id (16 hex digits, the same on every rank) that binds its checkpoints' hashes; None
        until the first save or resume sets it."""
        return self.saver.run_id

    @property
    def last_saved_step(self) -> int | None:
        """The step of the newest checkpoint this process saved or resumed from; None before either."""
        return self.saver.last_saved_step

    @property
    def model(self) -> nn.Module:
        """The model the manager saves and restores (the one passed in)."""
        return self.state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer the manager saves and restores (the one passed in)."""
        return self.state.optimizer

    def _open_store(self, directory: Path) -> CheckpointStore:
        """Rank 0 creates the directory; every rank learns whether that worked."""

        def create() -> None:
            CheckpointStore(directory, create=True)

        self.comm.on_coordinator(create)
        return CheckpointStore(directory)

    # ------------------------------------------------------------------ resume
    @_reports_fatal
    def resume(self) -> int | None:
        """Load the newest valid checkpoint; returns its step, or None on a fresh start.

        Every file is hash-checked as it is read and the probe is re-measured; a damaged
        checkpoint is quarantined and the previous one used, up to ``max_fallbacks`` times. At
        another world size the batch is re-planned (``batch`` then holds the new split).

        Raises:
            CkptError: another job owns the directory, the checkpoint does not fit this run (a
                changed model, another global batch, a newer format) or cannot be read (exit 2
                or 4, nothing moved), or no valid checkpoint is left (exit 3).
        """
        self.saver.wait()
        self.claim.ensure()
        resumed = self._resume_local() if self.local is not None else None
        if resumed is None:
            resumed = Resumption(self.config, self.state, self.probe_spec, self.store, self.comm, self._env, self.request, self.mesh).run()
        if self.local is not None:
            self.local.forget_after(resumed.step if resumed is not None else None)
        if self.comm.is_coordinator and not self.config.quiet:
            if resumed is None:
                progress.progress.info(progress.fresh_line(self.store.root))
            else:
                progress.progress.info(progress.resumed_line(resumed.step, Path(resumed.where), resumed.skipped))
        self.anomalies.start(resumed.step if resumed is not None else None)
        start = os.environ.get(ENV_REPLAY_FROM)
        if self.replay_until is not None and start and (resumed is None or resumed.step != int(start)):
            raise CkptError(
                f"ckpt replay: step {start} did not load ({'nothing was left to load' if resumed is None else f'step {resumed.step} was loaded instead'}): "
                "the lines above say why (damage found while loading, a probe that no longer matches?)",
                f"check it: ckpt validate and ckpt verify on the checkpoint directory (step {start})",
                ExitCode.FAILED,
            )
        if resumed is None:
            self.hb.beat(0, "step")
            return None
        self.saver.run_id, self.saver.batch, self.saver.last_saved_step = resumed.run_id, resumed.batch, resumed.step
        self.plan, self.extra = resumed.plan, resumed.extra
        self.hb.resumed(resumed.step)
        self.hb.beat(resumed.step, "step")
        return resumed.step

    def _resume_local(self) -> Resumed | None:
        """The fast tier's newest step complete across the job, loaded; None: the shared tier serves."""
        assert self.local is not None
        shared_newest, rolled_back_at = self.comm.on_coordinator(self._local_floor)
        local = self.local.resume(self.state, shared_newest, rolled_back_at)
        if local is None:
            return None
        where = "the fast tier (node-local copies), newer than the shared tier's newest"
        self._local_step = local.step
        return Resumed(local.step, local.run_id, local.batch, None, self.state.restore(local.rank_state), where)

    def _local_floor(self) -> tuple[int | None, float]:
        """What a local step must be newer than: the shared tier's newest step, and the time of its
        last rollback (a local step saved before it would undo the rollback)."""
        rollbacks = [e.time for e in self.store.events() if e.event == "rollback"]
        return self.saver.newest_in_directory(), max(rollbacks, default=0.0)

    # ------------------------------------------------------------------ save
    @_reports_fatal
    def maybe_save(self, step: int, extra: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None) -> bool:
        """Call once per optimizer step: beats the heartbeat, saves every ``save_every`` steps,
        and, when ``ckpt run`` asked for it (preemption, time limit), saves now and exits the
        process with status 0 once the checkpoint is committed (``ckpt run`` then exits
        "requeue"). ``extra``: JSON-able counters restored into ``manager.extra`` by resume().
        ``metrics``: this rank's values of the step (``{"loss": ..., "grad_norm": ...}``, floats or
        one-element tensors), recorded and checked (``CheckpointConfig.anomaly``): a step with a
        wrong value is not saved.

        Raises:
            CkptError: as ``save()``; exit 79 (``ExitCode.ANOMALY``) for a wrong value that
                stops the run (see ``CheckpointConfig.anomaly``); exit 2 for metrics that are not numbers.
            SystemExit: 79, to replay from the checkpoint (``ckpt run`` restarts the ranks).
        """
        self.hb.beat(step, "step")
        self._last_step, self._last_extra = step, extra
        scheduled = bool(self.config.save_every and step % self.config.save_every == 0)
        # before a scheduled save of either tier: no checkpoint holds replicas that disagree
        prints = self.replicas.fingerprint(step, scheduled or (self.local is not None and self.local.due(step)))
        values = as_floats(metrics) if metrics is not None else None
        if prints is not None:  # recorded among the step's values: a replay names the rank whose copy changed
            values = {**(values or {}), f"{FINGERPRINT}replicas": digest(prints)}
        if self.state_prints is not None:
            values = {**(values or {}), **self.state_prints.values()}
        finding = self.anomalies.observe(step, values) if values is not None else None
        stop, flagged = self._step_sync(step, finding is not None) if self.hb.active else (False, finding is not None)
        if self.replay_until is not None and step >= self.replay_until:
            self.close(final=False)  # the values of the replayed steps are recorded: nothing to save
            log.warning("ckpt: replayed up to step %d (ckpt replay): stopping", step)
            raise SystemExit(0)
        self._judge_step(step, finding, flagged, prints, audit=scheduled and not stop and self._audit_due(step))
        saved = False
        if stop:
            self.saver.closing = True  # the stop's save is the last: a failure stops (exit 78), it cannot say "committed"
        if stop or scheduled:
            self.save(step, extra)
            saved = True
        elif self.local is not None and self.local.due(step):
            saved = self._save_local(step, extra)
        if stop:
            self.close()
            self.hb.send_event("stopped", step=step)
            log.warning("ckpt: checkpoint of step %d committed on request (a preemption, or a node left behind); stopping", step)
            raise SystemExit(0)
        return saved

    def _step_sync(self, step: int, anomaly: bool) -> tuple[bool, bool]:
        """The step's synchronising collective under ``ckpt run``: did any rank get a stop request,
        did any rank find a wrong value? It also carries the step's timings (the job's best of
        each, for the straggler scores)."""
        stop, best = self.comm.step_sync(self.hb.stop_requested(), [1.0 if anomaly else 0.0, *self.hb.timer.arrive(step)])
        self.hb.timer.synced(best[1:])
        return stop, best[0] > 0

    # ------------------------------------------------------------------ wrong numbers
    def _audit_due(self, step: int) -> bool:
        """Whether this scheduled save is an audit's (every ``audit_every``-th; the same on every rank)."""
        every, interval = self.config.audit_every, self.config.save_every
        return bool(every and interval and (step // interval) % every == 0)

    def _judge_step(self, step: int, finding: Anomaly | None, flagged: bool, prints: list[int] | None, audit: bool = False) -> None:
        """The step's wrong numbers (the same decision on every rank): a replay's verdict at its
        step, else the findings (this rank's, every rank's when one was flagged on the step's sync),
        the replicas' comparison when they were fingerprinted, and an audit when one is due (a
        replay asked for with no wrong value). Returns only to go on."""
        if step == self.anomalies.replay_step:
            self._replay_verdict(step)  # every rank knows the step: they gather there together
            if prints is not None and (parted := self.replicas.compare(step, prints, self.comm)):
                self._on_anomaly(step, parted)  # still apart after the replay: a second anomaly, it stops
            return
        if self.anomalies.replaying(step):
            return  # the replay's steps are compared at its verdict, not judged one by one
        found: list[Anomaly] = []
        if flagged:  # under ckpt run a finding rode on the step's collective: every rank gathers them here
            found = [a for a in self.comm.main_gather(finding) if a is not None] if self.hb.active else [finding] if finding else []
        if prints is not None:
            found += self.replicas.compare(step, prints, self.comm)
        if audit and not found:
            found = [Anomaly(0, step, "audit", 0.0, "audit")]
        if found:
            self._on_anomaly(step, found)  # returns only to warn

    def _data_position(self) -> str:
        """The data's state now (``data.state_dict()``, e.g. the sampler's epoch and position), as
        JSON, shortened; empty without one. Where a reproducible wrong value's batch came from."""
        data = self.state.data
        if data is None or not hasattr(data, "state_dict"):
            return ""
        try:
            return json.dumps(data.state_dict(), default=str)[:300]
        except (TypeError, ValueError):
            return ""

    def _newest_checkpoint(self) -> int | None:
        steps = [s for s in (self.saver.last_saved_step, self._local_step) if s is not None]
        return max(steps) if steps else None

    def _on_anomaly(self, step: int, found: list[Anomaly]) -> None:
        """Wrong values at ``step`` (every rank has the same ``found``, except outside ``ckpt run``,
        where the rank that found one is alone). Warn and return, stop, or leave to replay."""
        last = self.anomalies.last or {}
        replayed_from = last.get("from") if last.get("status") == "done" else None
        plan = plan_anomaly(
            self.config.anomaly.mode, found, supervised=self.hb.active, checkpoint=self._newest_checkpoint(), replayed_from=replayed_from
        )  # type: ignore[union-attr]
        for mine in (a for a in found if a.rank == self.comm.rank):
            if mine.kind == "audit":
                self.hb.send_event("audit", step=step, from_step=plan.from_step, action=plan.action, why=plan.why)
            else:
                self.hb.send_event("anomaly", **mine.to_json(), action=plan.action, why=plan.why)
        if self.comm.is_coordinator:
            log.warning("ckpt: %s", plan.why)
        if plan.action == "warn":
            return
        self.anomalies.flush()
        if plan.action == "stop":
            earlier = f"; the earlier one: {last.get('message')}" if replayed_from is not None and last.get("message") else ""
            raise CkptError(
                f"wrong value in training: {plan.why}{earlier}",
                "see RUN_DIR/metrics/rank_R.jsonl for the values; fix the data or the model (or set CheckpointConfig(anomaly='warn')) and start again",
                ExitCode.ANOMALY,
            )
        self.saver.wait()  # an earlier step's save in flight commits: the replay may start from it
        if self.comm.is_coordinator:
            self.anomalies.begin_replay(step, plan.from_step, found)
        self.comm.barrier()  # anomaly.json is written before any rank leaves
        self.hb.send_event("replaying", step=step, from_step=plan.from_step)
        self.close(final=False)
        raise SystemExit(ExitCode.ANOMALY)

    def _replay_verdict(self, step: int) -> None:
        """The replay reached the anomaly's step: every rank's comparison, gathered, judged."""
        replays = self.comm.main_gather(self.anomalies.rank_replay())
        verdict = judge_replay(self.anomalies.replay_anomalies(), replays)
        if verdict.kind == "reproducible" and verdict.action == "continue" and self.config.on_reproducible_anomaly is not None:
            if self.config.on_reproducible_anomaly(verdict) == "stop":
                verdict = dataclasses.replace(verdict, action="stop")
        self.anomalies.end_replay(verdict, self._newest_checkpoint(), write=self.comm.is_coordinator)
        data = self._data_position()
        if self.comm.is_coordinator:
            self.hb.send_event("anomaly_replayed", **verdict.to_json(), data=data)
            log.warning("ckpt: %s", verdict.message())
        if self.comm.rank in verdict.ranks:
            self.hb.send_event("silent_fault", step=verdict.differs_at, differences=verdict.fields.get(self.comm.rank, ""))
        if verdict.action == "stop":
            self.comm.main_barrier()  # every rank's events reach the watchdog before any rank's fatal ends the round
            where = f"; the data's position after step {step} (its batch ends there): {data}" if data else ""
            raise CkptError(
                f"wrong value in training: {verdict.message()}{where}",
                "see RUN_DIR/metrics/rank_R.jsonl and anomaly.json; fix the data or the model and start again",
                ExitCode.ANOMALY,
            )

    @_reports_fatal
    def save(self, step: int, extra: dict[str, Any] | None = None) -> None:
        """Checkpoint the state after optimizer step ``step``.

        Sync: returns when the checkpoint is committed. Async: returns once staging has started;
        the copy to CPU memory must finish before the next optimizer step (a step pre-hook
        waits for it); writing, hashing and committing run in the background.

        A save that fails on the disk (full, read-only, I/O error, vanished directory) is logged
        as a warning on rank 0, its partial files removed, LATEST left alone; the next save
        retries (``max_failed_saves``).

        Raises:
            CkptError: ``max_failed_saves`` saves failed in a row (exit 78: the message names the
                OS error, the directory, the bytes needed and free), the step is behind the
                newest checkpoint (exit 2), or another job took the directory over (exit 4).
        """
        if self._closed:
            raise CkptError("save() after close()", "create a new CheckpointManager")
        self.anomalies.flush()
        with self.hb.phase("checkpoint"):
            self.claim.ensure()  # a script that saves without resume() first
            self.saver.save(step, extra)

    def _save_local(self, step: int, extra: dict[str, Any] | None) -> bool:
        """A save to the fast tier: the shards copied to CPU memory now, written and copied to
        the peers in the save thread. False when the tier is off (no room)."""
        assert self.local is not None
        local = self.local
        with self.hb.phase("checkpoint"):
            self.claim.ensure()
            self.saver.wait()  # one save in flight, of either tier: they share the save thread's collectives
            run_id = self.saver.ensure_run_id()
            probe = local.measure(self.state, step)
            staged = local.stage(self.state)
            if staged is None:
                return False
            rank_json = state_codec.dumps(self.state.capture(step, extra))
            batch, saver = self.saver.batch, self.saver
            saver.in_background(lambda: local.write(staged, step, rank_json, run_id, batch, saver.committed_step, probe))
        self._local_step = step
        return True

    # ------------------------------------------------------------------ waiting and shutdown
    def wait_for_staging(self) -> None:
        """Block until an async save's copy to CPU memory is done (the optimizer hook calls it)."""
        self.saver.wait_for_staging()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the in-flight save (staging and commit); re-raise its failure."""
        self.saver.wait(timeout)

    @_reports_fatal
    def close(self, timeout: float | None = None, final: bool | None = None) -> None:
        """Save the final step (``save_final``, unless ``final=False``), wait for the in-flight
        save and release the manager's resources. Collective. No final save while an exception
        is propagating (the state may be half-way through a step) or at interpreter exit.

        Raises:
            CkptError: the final or in-flight save failed (exit 78: no later save could retry it,
                unless ``max_failed_saves=0``), or see ``save()``.
        """
        with self._lock:
            if self._closed:
                return
        want_final = self.config.save_final if final is None else final
        self.saver.closing = True  # no later save: a failure of the final or the in-flight save stops
        if want_final and self._last_step is not None and self._last_step != self.last_saved_step and sys.exc_info()[0] is None:
            self.save(self._last_step, self._last_extra)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.saver.wait(timeout=self.config.exit_wait_s if timeout is None else timeout)
            if self.local is not None and want_final and sys.exc_info()[0] is None and self.saver.committed_step == self._last_step:
                self.local.clean_up()  # the last step is in the shared tier: the local copies are of no more use
        finally:
            self.anomalies.close()
            self.claim.stop()
            self.saver.shutdown()
            if self.local is not None:
                self.local.close()
            self.comm.close()
            atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        try:
            self.close(final=False)
        except CkptError as exc:  # at interpreter exit: say it, without a traceback
            log.error("ckpt: %s (hint: %s)", exc.message, exc.hint)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM under ``ckpt run`` (preemption: SLURM signals every process): checkpoint at the
        next step and stop, as if the supervisor had asked. Otherwise: let an in-flight save
        commit (up to ``exit_wait_s``), then die as SIGTERM would."""
        if self.hb.active:
            self.hb.terminated()
            self.hb.request_stop()
            return
        try:
            self.close(final=False)
        except BaseException as exc:  # noqa: BLE001 - dying anyway; say why the save was lost
            log.error("ckpt: in-flight save lost at SIGTERM: %s", exc)
        signal.signal(signal.SIGTERM, self._previous_term if callable(self._previous_term) else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
