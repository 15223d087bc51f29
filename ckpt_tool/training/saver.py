"""Saving: stage, write through DCP (hashing as it writes), commit with the shared protocol.

Sync saves return once committed. Async saves return once staging (a copy to CPU memory) has
started; the copy must finish before the next optimizer step (the manager's step pre-hook waits
for it); writing, hashing and committing run in a background thread; at most one is in flight.
A failed save removes its staging directory, never moves LATEST and says why (the OS error, the
free space and the bytes needed, the previous checkpoint); the training goes on and retries at the
next save until ``max_failed_saves`` failures in a row stop it (``save_failures``). An async
save's failure is noticed at the next save or at ``close()`` and counted the same way.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.manifest import FileEntry, Manifest, Probe
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.errors import CkptError, ConflictError, ExitCode, SaveFailedError
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.timing import span
from ckpt_tool.training import state_codec
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.commit import commit_staged
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.hashing_fs import HashingFileSystem, hashing_writer
from ckpt_tool.training.heartbeat import Heartbeat
from ckpt_tool.training.probe import ProbeSpec, measure
from ckpt_tool.training.progress import committed_line, progress
from ckpt_tool.training.rank_state import TrainingState
from ckpt_tool.training.safe_dcp import dcp_failures, single_process_quietly
from ckpt_tool.training.save_failures import FailedSavePolicy, Needed, SaveFailure, describe, human_bytes
from ckpt_tool.training.torch_state import align_replicated_buffers, live_state

log = logging.getLogger("ckpt_tool")


class Saver:
    """Writes checkpoints of ``state`` into ``store``. ``before_commit(step)`` runs in the
    save's thread after the files are written and before the commit (tests use it to widen
    that window)."""

    def __init__(
        self,
        config: CheckpointConfig,
        state: TrainingState,
        probe: ProbeSpec | None,
        store: CheckpointStore,
        comm: Comm,
        hb: Heartbeat,
        env: Callable[[], dict[str, Any]],
        mesh: Mesh,
        before_commit: Callable[[int], None] | None = None,
    ) -> None:
        self.config, self.state, self.probe, self.store, self.comm, self.hb = config, state, probe, store, comm, hb
        self.env, self.mesh, self.before_commit = env, mesh, before_commit
        self.run_id: str | None = None
        self.batch: BatchConfig | None = None
        self.last_saved_step: int | None = None
        self.committed_step: int | None = None  # the newest step this run committed to the shared tier
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-commit")
        self._inflight: Future | None = None
        self._staging: Future | None = None
        self._stager: Any = None
        self.policy = FailedSavePolicy(config.max_failed_saves)
        self.failed_in_a_row = 0  # failed saves since the last commit (reset by a commit)
        self.closing = False  # no later save will retry a failure now (close, a stop request's save)
        self._rank_bytes = 0  # this rank's tensor bytes in the save under way (the bytes it needed)
        # what the commit event's blocked_s is made of: when save() was called, and per step when the
        # staging finished and when the training thread began to wait for it (the optimizer's hook)
        self._save_began = 0.0
        self._staged_at: dict[int, float] = {}
        self._wait_began: dict[int, float] = {}
        self._staging_step: int | None = None

    # ------------------------------------------------------------------ saving
    def save(self, step: int, extra: dict[str, Any] | None) -> None:
        """Save ``step`` (collective: every rank calls it with the same step) with ``extra`` in the rank state,
        after waiting for the save in flight; with ``async_save`` it returns once the state is staged and the
        commit goes on in the background. A failed save goes through ``handle_error``: a warning, or raised.
        The time it blocks the caller, and the wait for its staging after, are the commit's ``blocked_s``."""
        self._save_began = time.monotonic()
        self.wait()  # at most one save in flight
        self._check_step_grows(step)
        self.ensure_run_id()
        model, optimizer = self.state.model, self.state.optimizer
        align_replicated_buffers(model)
        lr = float(optimizer.param_groups[0]["lr"])
        probe = measure(model, self.probe, lr, step) if self.probe is not None else None
        with live_state(model, optimizer) as live:  # an optimizer without state yet: built without a copy of the model
            dcp_state: dict[str, Any] = {"model": live.model_sd, "optim": live.optim_sd}
        if self.probe is not None:
            dcp_state["probe"] = self.probe.batch
        rank_json = state_codec.dumps(self.state.capture(step, extra))
        self._rank_bytes = tensor_bytes(dcp_state) + len(rank_json)
        if not self.store.root.is_dir():  # never recreate it: that would start a new, empty history
            self.handle_error(
                SaveFailedError(
                    f"checkpoint directory {self.store.root} vanished (unmounted or deleted?)",
                    "restore or remount it; the previous checkpoints are wherever it went",
                    ExitCode.SAVE_FAILED,
                )
            )
            return
        try:
            partial = self.store.begin_staging(step)
        except OSError as exc:
            self.handle_error(self._failed(step, exc))
            return
        writer, fs = hashing_writer(partial, self.run_id, step, self.config.io_threads)  # hashes as it writes
        commit_args = (fs, step, rank_json, probe, time.time(), self.env())
        if self.config.async_save:
            try:
                with span("save.async_start"), single_process_quietly():
                    response = dcp.async_save(
                        dcp_state,
                        storage_writer=writer,
                        process_group=self.comm.group,
                        async_stager=self._get_stager(),
                        no_dist=not self.comm.distributed,
                    )
            except (CheckpointException, OSError) as exc:
                self.handle_error(self._failed(step, exc))
                return
            self._staging, self._staging_step = response.staging_completion, step
            response.staging_completion.add_done_callback(lambda _: self._staged_at.__setitem__(step, time.monotonic()))
            held = time.monotonic() - self._save_began
            self._inflight = self._executor.submit(self._finish, response.upload_completion, *commit_args, held)
        else:
            try:
                with span("save.write"), fs.writers_settled(), single_process_quietly():
                    dcp.save(dcp_state, storage_writer=writer, process_group=self.comm.group, no_dist=not self.comm.distributed)
            except (CheckpointException, OSError) as exc:
                self.handle_error(self._failed(step, exc))
                return
            try:
                self._finish(None, *commit_args, time.monotonic() - self._save_began)
            except CkptError as exc:
                self.handle_error(exc)
                return
        self.last_saved_step = step

    def ensure_run_id(self) -> str:
        """The run's id (resumed, or made by rank 0 at the first save). Collective the first time."""
        if self.run_id is None:
            self.run_id = self.comm.broadcast(uuid.uuid4().hex[:16] if self.comm.is_coordinator else None)
        assert self.run_id is not None
        return self.run_id

    def in_background(self, work: Callable[[], None]) -> None:
        """Run ``work`` in the save thread, as the in-flight save (``wait()`` waits for it)."""
        self.wait()
        self._inflight = self._executor.submit(work)

    def _check_step_grows(self, step: int) -> None:
        """Refuse a save behind the newest checkpoint: LATEST would move back, and the next start
        would roll forward to the newer-numbered (older) checkpoint. The same step again is a
        supersede (the old one is quarantined). Before the first save or resume, the directory
        is asked (one listing, on rank 0)."""
        newest = self.last_saved_step
        if newest is None:
            newest = self.comm.on_coordinator(self.newest_in_directory)
        if newest is not None and step < newest:
            raise CkptError(
                f"save({step}): {self.store.root} already holds checkpoint step {newest}; steps must not go back",
                "call resume() before training to continue from it, use a new directory for a new run, or `ckpt rollback --to N` first to go back on purpose",
                ExitCode.USAGE,
            )

    def newest_in_directory(self) -> int | None:
        """The highest step LATEST or a committed directory names (one listing)."""
        latest = self.store.latest_or_none()
        return max([*self.store.committed_on_disk(), *([] if latest is None else [latest])], default=None)

    def _get_stager(self) -> Any:
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            accel = torch.cuda.is_available()
            # One staging buffer, cached and reused across saves; pinned + non-blocking on GPUs.
            self._stager = DefaultStager(
                StagingOptions(use_pinned_memory=accel, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=accel)
            )
        return self._stager

    def _finish(
        self,
        upload: Future | None,
        fs: HashingFileSystem,
        step: int,
        rank_json: bytes,
        probe: Probe | None,
        created_at: float,
        env: dict[str, Any],
        held_s: float = 0.0,
    ) -> None:
        """Per-rank file + hashes, gathered; rank 0 writes the manifest and commits. ``held_s``: the
        seconds ``save()`` held the training thread; the wait for the staging is added here (staging
        ends before the upload: if the training thread began to wait, its wait ended at ``staged_at``)."""
        if upload is not None:
            try:
                with span("save.upload_wait"), fs.writers_settled():
                    upload.result()
            except (CheckpointException, OSError) as exc:
                raise self._failed(step, exc) from None
        if self.before_commit is not None:
            self.before_commit(step)
        assert self.run_id is not None
        run_id = self.run_id

        made: list[Manifest] = []

        def make_manifest(files: tuple[FileEntry, ...]) -> Manifest:
            made.append(manifest := self._manifest(run_id, step, created_at, files, env, probe))
            return manifest

        try:
            staged, waited = self._staged_at.pop(step, None), self._wait_began.pop(step, None)
            staging_wait = max(0.0, staged - waited) if staged is not None and waited is not None else 0.0
            facts = {"blocked_s": round(held_s + staging_wait, 4)}
            with span("save.commit"):
                commit_staged(self.store, self.comm, step, run_id, fs, rank_json, make_manifest, self.config.retention, facts)
        except (CkptError, OSError) as exc:
            raise self._failed(step, exc) from None
        self.committed_step = step
        self.failed_in_a_row = 0
        self.hb.checkpoint_committed(step)
        if made and not self.config.quiet:  # rank 0 made the manifest
            progress.info(committed_line(step, self.store.step_path(step), made[0].total_bytes, time.time() - created_at))

    def _manifest(
        self, run_id: str, step: int, created_at: float, files: tuple[FileEntry, ...], env: dict[str, Any], probe: Probe | None
    ) -> Manifest:
        return Manifest(
            run_id=run_id,
            step=step,
            created_at=created_at,
            world_size=self.comm.world_size,
            files=files,
            batch=self.batch,
            mesh=self.mesh,
            env=env,
            probe=probe,
            entry_point=self.config.entry_point,
            entry_kwargs=self.config.entry_kwargs,
        )

    # ------------------------------------------------------------------ failures
    def _failed(self, step: int, exc: BaseException) -> CkptError:
        """Remove the staging directory of a failed save and say why, with the space involved.
        Every rank removes it (all of them are done with it when DCP or the commit raises), so
        that each measures the free space without the partial files."""
        self.store.discard_staging(step)
        if isinstance(exc, ConflictError):  # not a disk problem (a directory taken over, a lock held)
            return type(exc)(f"saving step {step} failed: {exc.message}", exc.hint, exc.exit_code)
        cause = root_os_error(exc)
        latest = self.store.latest_or_none()
        shown = cause or first_failure(exc)
        text = (cause.strerror if cause is not None else None) or (shown.message if isinstance(shown, CkptError) else str(shown))
        failure = SaveFailure(
            step=step,
            root=self.store.root,
            error_type=type(shown).__name__,
            error_text=(text or repr(shown)).splitlines()[0],
            errno=cause.errno if cause is not None else None,
            filename=str(cause.filename) if cause is not None and cause.filename else None,
            free=_free_bytes(self.store.root),
            needed=self._needed(latest),
            latest=latest,
        )
        return describe(failure)

    def _needed(self, latest: int | None) -> Needed | None:
        """The bytes this save needed: the previous checkpoint's size (the same model and world
        write about as much), else this rank's bytes times the ranks."""
        if latest is not None:
            try:
                return Needed(self.store.read_manifest(latest).total_bytes, f"the size of step {latest}")
            except CkptError:
                pass
        if not self._rank_bytes:
            return None
        world = self.comm.world_size
        if world == 1:
            return Needed(self._rank_bytes, "this process's tensors and state")
        return Needed(self._rank_bytes * world, f"this rank's {human_bytes(self._rank_bytes)} x {world} ranks")

    def handle_error(self, error: CkptError) -> None:
        """A failed save: counted and logged as a warning while the training can go on (retried
        at the next save); raised when ``max_failed_saves`` came in a row, or when no later save
        would retry (``closing``). What is not a disk failure (a directory taken over, a step
        going back) is raised at once."""
        if not isinstance(error, SaveFailedError):
            raise error
        self.failed_in_a_row += 1
        if self.policy.stops(self.failed_in_a_row, self.closing):
            raise self.policy.stop_error(error, self.failed_in_a_row, self.closing)
        if self.comm.is_coordinator:
            log.error("%s", self.policy.warning(error, self.failed_in_a_row))

    # ------------------------------------------------------------------ waiting and shutdown
    def wait_for_staging(self) -> None:
        """Wait until the in-flight async save has copied the state off the tensors (they may change again
        after); re-raises the staging's failure."""
        with span("save.staging_wait"):
            staging, self._staging = self._staging, None
            if staging is not None:
                if self._staging_step is not None:
                    self._wait_began.setdefault(self._staging_step, time.monotonic())
                staging.result()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the in-flight save (staging and commit); re-raise its failure."""
        with span("save.wait"):
            self.wait_for_staging()
            inflight, self._inflight = self._inflight, None
            if inflight is not None:
                try:
                    inflight.result(timeout=timeout)
                except CkptError as exc:
                    self.handle_error(exc)

    def shutdown(self) -> None:
        """Stop the background executor without waiting and close the stager; call ``wait`` first to keep the
        save in flight."""
        self._executor.shutdown(wait=False)
        if self._stager is not None:
            self._stager.close()


def _free_bytes(root: Any) -> int | None:
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def tensor_bytes(state: Any) -> int:
    """The bytes of this rank's tensors in a (nested) state dict: a DTensor counts its local shard."""
    if isinstance(state, torch.Tensor):
        local = getattr(state, "_local_tensor", state)
        return int(local.numel() * local.element_size())
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def first_failure(exc: BaseException) -> BaseException:
    """The first rank's exception inside DCP's CheckpointException (its own text only lists the
    ranks), or ``exc`` itself."""
    if isinstance(exc, CheckpointException):
        inner = dcp_failures(exc)
        return first_failure(inner[0]) if inner else exc
    return exc


def root_os_error(exc: BaseException) -> OSError | None:
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
        todo += [getattr(e, "os_error", None), e.__cause__, e.__context__]  # os_error: a commit's (training.commit)
    return None
