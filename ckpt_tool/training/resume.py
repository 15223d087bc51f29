"""Resuming: the newest checkpoint that passes every check, loaded into the run's state.

The first candidate is the step ``ckpt recover`` chose at this start (``RUN_DIR/recover.json``)
while that decision is current (``core.recovery.stale_because``): its structure check stands and
the step is not chosen again. Otherwise (no decision, a stale one) the recovery planner's
``Resume`` chooses it: LATEST, or a fallback when it is missing or garbage. It is checked for
structure (files and sizes, DCP metadata safe to read), loaded with every file hash-checked as
DCP reads it, and verified by re-measuring the probe. Damage sends it to quarantine and the
previous one is tried, up to ``max_fallbacks``; what is not damage (a checkpoint that does not
fit the run, a newer format, a file this user may not read) is raised on every rank and moves
nothing. Collective: every rank runs the same steps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tool.core import layout
from ckpt_tool.core.batch import BatchConfig, BatchRequest
from ckpt_tool.core.exactness import trajectory_differences
from ckpt_tool.core.manifest import Manifest
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.core.recovery import RECOVER_NAME, Damaged, Recorded, Resume, plan, stale_because
from ckpt_tool.core.reshard_plan import ReshardPlan, plan_resume
from ckpt_tool.errors import CkptError, DamageError, ExitCode
from ckpt_tool.store import recovery
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.timing import span
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.hashing_fs import verifying
from ckpt_tool.training.probe import ProbeSpec, check_loaded_model
from ckpt_tool.training.progress import progress
from ckpt_tool.training.rank_state import TrainingState, read_rank_state
from ckpt_tool.training.safe_dcp import load_state
from ckpt_tool.training.torch_state import LiveState, live_state
from ckpt_tool.training.validation import validate_checkpoint

log = logging.getLogger("ckpt_tool")
RUN_DIR_ENV = "CKPT_RUN_DIR"  # exported to the ranks by `ckpt run`; else CKPT_DIR/run


@dataclass(frozen=True)
class Resumed:
    """Where a resume landed: the step loaded and its run id, the batch split to train with from there, the
    reshard plan when the mesh changed, the ``extra`` saved with it, where it came from, and why newer
    candidates were passed over (rank 0's words)."""

    step: int
    run_id: str
    batch: BatchConfig | None  # the split to train with from here (the reshard plan's, or the saved one)
    plan: ReshardPlan | None  # set when the mesh changed
    extra: dict[str, Any]
    where: Path | str = ""  # the checkpoint's directory (or the tier it came from)
    skipped: list[str] = field(default_factory=list)  # why newer candidates were passed over (rank 0 knows)


class Resumption:
    """One resume of ``state`` from ``store`` (see the module docstring)."""

    def __init__(
        self,
        config: CheckpointConfig,
        state: TrainingState,
        probe: ProbeSpec | None,
        store: CheckpointStore,
        comm: Comm,
        env: Callable[[], dict[str, Any]],
        requested: BatchRequest | None,
        mesh: Mesh,
    ) -> None:
        self.config, self.state, self.probe, self.store, self.comm = config, state, probe, store, comm
        self.env, self.requested, self.mesh = env, requested, mesh
        self._model_differs = False  # the last load left checkpoint entries of the model unused
        self.skipped: list[str] = []  # rank 0: why each newer candidate was passed over, for the resume's line
        self.followed: Recorded | None = None  # `ckpt recover`'s decision, while the first candidate is its step

    def run(self) -> Resumed | None:
        """The resumed checkpoint, or None on a fresh start (no checkpoint at all)."""
        with span("resume.crash_cleanup"):
            actions = self.comm.on_coordinator(
                lambda: recovery.clean_up_after_crash(self.store, roll_forward=lambda s: validate_checkpoint(self.store, s).ok)
            )
        for action in actions:
            log.warning("ckpt: %s", action)
        self.followed = self.comm.on_coordinator(self._recorded)
        for _ in range(self.config.max_fallbacks + 1):
            if self.followed is not None:
                candidate, problems = self.followed.step, []  # chosen and structure-checked by `ckpt recover`
            else:
                candidate = self.comm.on_coordinator(self._candidate)
                if candidate is None:
                    return None
                problems = self._check_structure(candidate)
            resumed = None
            if not problems:
                resumed, problems = self._load(candidate)
            if not problems:
                problems = self._verify_loaded(candidate)
            if not problems:
                assert resumed is not None
                return Resumed(**{**resumed.__dict__, "skipped": list(self.skipped)})
            self.followed = None  # after damage the planner chooses (``Damaged``), not recover.json
            if self.comm.is_coordinator:
                self._fall_back(candidate, problems)
            self.comm.barrier()
        raise CkptError(
            f"no valid checkpoint in {self.store.root}: the newest {self.config.max_fallbacks + 1} were damaged and quarantined",
            f"inspect {self.store.quarantine_root} and the index; run `ckpt validate --all`",
            ExitCode.NOT_FOUND,
        )

    def run_dir(self) -> Path:
        """Where ``ckpt recover`` left its decision: ``$CKPT_RUN_DIR`` (``ckpt run`` sets it), else
        ``CKPT_DIR/run``."""
        given = os.environ.get(RUN_DIR_ENV)
        return Path(given) if given else self.store.root / layout.RUN_DIR_NAME

    def _recorded(self) -> Recorded | None:
        """``ckpt recover``'s decision when it is current for this directory and world size
        (said on the progress line either way); None: the ranks choose the step themselves."""
        path = self.run_dir() / RECOVER_NAME
        recorded = recovery.read_recorded(self.run_dir())
        if recorded is None:
            if path.exists():
                self._say(f"ckpt: {path} is not followed: it holds no decision to resume from; choosing the step here")
            return None
        try:
            latest = self.store.read_latest()
        except CkptError:
            latest = None
        where, facts = recovery.identity(self.store)
        why = stale_because(recorded, where, latest, facts, self.comm.world_size)
        if why is not None:
            self._say(f"ckpt: {path} is not followed ({why}); choosing the step here")
            return None
        checked = "hashes" if recorded.hashes_checked else "structure"
        self._say(
            f"ckpt: step {recorded.step}, as `ckpt recover` decided ({path}; its {checked} check stands, each file is hash-checked as it loads)"
        )
        return recorded

    def _say(self, line: str) -> None:
        if not self.config.quiet:
            progress.info(line)

    def _candidate(self) -> int | None:
        """The recovery planner's ``Resume``: LATEST's step when it names a committed checkpoint;
        else (said in the store's words, ``require_latest``) the newest committed one, LATEST
        moved to it; None: a fresh start."""
        latest, problem = None, None
        try:
            latest = self.store.read_latest()
            if latest is not None or self.store.committed_on_disk():
                latest = self.store.require_latest()
        except CkptError as exc:
            problem = exc.message
        decided = plan(recovery.view(self.store, latest, problem), Resume())
        if decided.problem is not None:
            raise CkptError(
                f"{decided.problem} in {self.store.root}",
                f"`ckpt validate {self.store.root} --all` shows what is there; start the run from scratch in a new directory, "
                f"or restore a checkpoint from {self.store.quarantine_root}",
                ExitCode.NOT_FOUND,
            )
        if decided.actions:
            log.warning(
                "ckpt: %s; falling back to step %d (LATEST moved there; `ckpt validate %s --all` checks the others)",
                problem,
                decided.step,
                self.store.root,
            )
            self.skipped.extend(decided.lines)
            recovery.carry_out(self.store, decided)
        return decided.step

    def _check_structure(self, step: int) -> list[str]:
        """Rank 0 checks the files are all there with their sizes and the mesh fits; the hashes (and
        the DCP metadata, safe to read) are checked as the files are loaded (one read of the data). Damage
        is returned as problems; what is not damage is raised on every rank."""
        if not self.config.validate_on_resume:
            return []

        def check() -> list[str]:
            with span("resume.structure_check"):
                # the load reads .metadata itself, checked against the manifest before DCP sees it, and
                # refuses a file the manifest does not list: read here too, it would be read twice
                result = validate_checkpoint(self.store, step, hashes=False, dcp_metadata=False)
            if result.unreadable and not result.problems:
                raise self.store.permission_denied(self.store.step_path(step) / result.unreadable[0])
            return [str(p) for p in result.problems]

        try:
            return self.comm.on_coordinator(check)
        except CkptError as exc:
            if isinstance(exc, DamageError):
                return [exc.message]
            raise type(exc)(f"checkpoint step {step}: {exc.message}", exc.hint, exc.exit_code) from None

    def _load(self, step: int) -> tuple[Resumed | None, list[str]]:
        """Load model, optimizer and this rank's state, every file hash-checked as it is read.
        Returns the problems that make this checkpoint unusable (the same on every rank)."""
        path = self.store.step_path(step)
        manifest = self.store.read_manifest(step)
        # adopted weights (`ckpt adopt`) are initial weights: any mesh, this run's batch and seeds
        plan = self._plan_reshard(manifest) if manifest.layout.dims != self.mesh.dims and not manifest.adopted else None
        for why in [] if manifest.adopted else trajectory_differences(manifest.env, self.env()):
            log.warning("ckpt: resume from step %d will not be bit-identical: %s", step, why)
        model, optimizer = self.state.model, self.state.optimizer
        if not optimizer.state:
            # torch builds the empty optimizer state DCP loads into only when no parameter has a
            # gradient; with gradients present it returns no optimizer state and the checkpoint's
            # would be skipped without a word. Gradients from before a resume are stale anyway.
            optimizer.zero_grad(set_to_none=True)
        with live_state(model, optimizer) as live:
            rank_state, problems = self._load_into(live, manifest)
            if problems:
                return None, problems
            live.set_loaded()
        extra = {} if manifest.adopted else self.state.restore(rank_state)
        if plan is not None and self.comm.is_coordinator:
            self.store.append_event(
                "reshard", step=step, from_world_size=manifest.world_size, to_world_size=self.comm.world_size, batch=plan.to_json()
            )  # the plan's JSON holds both meshes
        if manifest.adopted:
            self.skipped.append("nothing: these are the weights `ckpt adopt` put there (fresh optimizer and data position)")
            batch = self.requested.resolve(self.mesh.dp_size) if self.requested is not None else None
        else:
            batch = plan.new if plan is not None else self._batch_same_size(manifest)
        return Resumed(step, manifest.run_id, batch, plan, extra, path), []

    def _load_into(self, live: LiveState, manifest: Manifest) -> tuple[dict[str, Any], list[str]]:
        """DCP load into ``live``'s state dicts, every file hash-checked as it is read; returns
        this rank's JSON state and the problems that make the checkpoint unusable (the same on
        every rank). What is not damage is raised on every rank."""
        step = manifest.step
        path = self.store.step_path(step)
        verify_fs = verifying(manifest, step)
        problems: list[str] = []
        mismatch: CkptError | None = None
        rank_state: dict[str, Any] = {}
        try:
            dcp_state = {"model": live.model_sd} if manifest.adopted else {"model": live.model_sd, "optim": live.optim_sd}
            with span("resume.load"):
                unused = load_state(
                    dcp_state,
                    path,
                    process_group=self.comm.group,
                    no_dist=not self.comm.distributed,
                    verify_with=verify_fs,
                    threads=self.config.io_threads,
                    cooperative=self.config.cooperative_load,
                )
            not_loaded = [k for k in unused if k.split(".", 1)[0] in dcp_state]  # the probe batch is verify's
            self._model_differs = any(k.startswith("model.") for k in not_loaded)
            if not_loaded and self.comm.is_coordinator:
                log.warning(
                    "ckpt: %d entries of checkpoint step %d were not loaded, the model or optimizer differs from the saved one: %s",
                    len(not_loaded),
                    step,
                    ", ".join(not_loaded[:5]) + (", ..." if len(not_loaded) > 5 else ""),
                )
            if not manifest.adopted:  # adopted weights carry no training state
                rank_state = read_rank_state(path, verify_fs, self.comm.rank, self.mesh, manifest.layout)
        except CkptError as exc:
            if not isinstance(exc, DamageError):  # not damage: does not fit the run, not readable by this user
                mismatch = exc
            problems = [exc.message]
        gathered = self.comm.all_gather((problems, mismatch))
        conflicts = [m for _, m in gathered if m is not None]
        if conflicts:  # not damage: no quarantine, no fallback to an older checkpoint
            raise type(conflicts[0])(f"checkpoint step {step}: {conflicts[0].message}", conflicts[0].hint, conflicts[0].exit_code)
        return rank_state, sorted({p for rank_problems, _ in gathered for p in rank_problems})

    def _batch_same_size(self, manifest: Manifest) -> BatchConfig | None:
        """On the saved mesh: the saved split, re-planned only when the command asks for another
        micro-batch (the checkpoint's global batch still wins) or another global batch."""
        if manifest.batch is None:
            return self.requested.resolve(self.mesh.dp_size) if self.requested is not None else None
        batch = plan_resume(manifest.batch, manifest.layout, manifest.lineage, self.mesh, requested=self.requested).new
        if batch.global_batch != manifest.batch.global_batch:
            log.warning("ckpt: global batch %d -> %d, as this run asks (--global-batch)", manifest.batch.global_batch, batch.global_batch)
        return batch

    def _plan_reshard(self, manifest: Manifest) -> ReshardPlan:
        """A different mesh: the one plan (``core.reshard_plan.plan_resume``, the same ``ckpt recover``
        reports) checks the mesh fits the model, keeps the global batch and changes it only when
        the run gives another one explicitly."""
        plan = plan_resume(manifest.batch, manifest.layout, manifest.lineage, self.mesh, requested=self.requested)
        planned = self.followed.reshard.get("new") if self.followed is not None and self.followed.reshard is not None else None
        if planned is not None and planned != plan.to_json()["new"]:
            log.warning(
                "ckpt: the batch split differs from `ckpt recover`'s plan (%s): this run asks for %s (--micro-batch/--global-batch)",
                planned,
                plan.to_json()["new"],
            )
        log.warning(
            "ckpt: resharding step %d from %s to %s: micro-batch %d x grad accumulation %d (was %d x %d), global batch %d (was %d)",
            manifest.step,
            manifest.layout.describe(),
            self.mesh.describe(),
            plan.new.micro_batch,
            plan.new.grad_accum,
            plan.old.micro_batch,
            plan.old.grad_accum,
            plan.new.global_batch,
            plan.old.global_batch,
        )
        return plan

    def _verify_loaded(self, step: int) -> list[str]:
        """The probe checks on the freshly loaded state (``ckpt verify`` in-process)."""
        if not self.config.verify_on_resume or self.probe is None or self.store.read_manifest(step).probe is None:
            return []
        if self._model_differs:  # the probe measures the saved model; this one has other parts
            log.warning("ckpt: the probe check of step %d is skipped: this run's model is not the one that saved it", step)
            return []
        try:
            report = check_loaded_model(self.state.model, self.probe.loss_fn, self.store, step, self.mesh, self.comm.group)
            problems = [f"verify {failure}" for failure in report.failures()]
        except (CkptError, OSError) as exc:
            problems = [f"verify: {getattr(exc, 'message', exc)}"]
        return sorted({p for rank_problems in self.comm.all_gather(problems) for p in rank_problems})

    def _fall_back(self, bad: int, problems: list[str]) -> None:
        """Damage the ranks found goes back through the recovery planner (``Damaged``): the
        step is quarantined and LATEST moves to the one before it."""
        log.error("ckpt: checkpoint step %d is damaged (%s): quarantining it", bad, "; ".join(problems[:5]))
        decided = plan(recovery.view(self.store), Damaged(bad, tuple(problems)))
        recovery.carry_out(self.store, decided)
        self.skipped.extend(decided.lines)
