"""The fast tier: each rank's shards saved to a node-local directory every few steps, a copy
kept by a rank on another node, and resumed from when it is newer than the shared tier.

A local save measures the probe, copies the rank's shards (the local parts of its DTensors) to
CPU memory while training waits (torch's stager: buffers reused from save to save, pinned on
GPUs), then, in the save thread: writes them as a single-process DCP checkpoint with the rank's
JSON state and a manifest of seeded hashes (``rank_R/step_N``, see ``core.local_tier``), agrees
with every rank that all were written, sends the directory to its peers (``local_wire``) and
deletes what is no longer needed. A node without room, or a failed write, turns the tier off for
the run with a warning: training goes on with the shared tier.

Resume (collective): every rank checks the copies its node holds (hashes), the ranks agree on
the newest step that is complete across the job and newer than the shared tier's newest, the
holders send the copies a rank lacks, every rank loads its own, and the probe is re-measured.
Any problem: the shared tier serves. Only the mesh that wrote a local step can load it (a
reshard goes through the shared tier).
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ckpt_tool.core import layout
from ckpt_tool.core import local_tier as rules
from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.manifest import Manifest, Probe
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.errors import CkptError
from ckpt_tool.store.durable import atomic_write, directory_replaced
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training import local_wire, state_codec
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.commit import written_entries
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.hashing_fs import hashing_writer, verifying
from ckpt_tool.training.probe import ProbeSpec, measure, verify_model
from ckpt_tool.training.rank_state import TrainingState
from ckpt_tool.training.safe_dcp import load_state, single_process_quietly
from ckpt_tool.training.shard_views import local_views, tensor_bytes, write_back
from ckpt_tool.training.torch_state import live_state

log = logging.getLogger("ckpt_tool")
ENV_LOCAL_DIR = "CKPT_LOCAL_DIR"


@dataclass(frozen=True)
class LocalResumed:
    """What a resume from the fast tier loaded: the step, its run id and batch split, this rank's non-tensor
    state (``rank_R.state.json``'s content) and the manifest of the local checkpoint."""

    step: int
    run_id: str
    batch: BatchConfig | None
    rank_state: dict[str, Any]
    manifest: Manifest


class LocalTier:
    """One run's fast tier on this rank (collective: every rank makes one and calls every method)."""

    def __init__(
        self,
        config: CheckpointConfig,
        ckpt_root: Path,
        comm: Comm,
        mesh: Mesh,
        env: Callable[[], dict[str, Any]],
        record: Callable[..., None] | None = None,
        probe: ProbeSpec | None = None,
    ) -> None:
        """``record(event, **data)`` (rank 0): what was saved where, for ``ckpt list`` (the shared
        index). ``probe``: measured at each local save and re-measured at a local resume, as in
        the shared tier (``verify_on_resume``)."""
        self.config, self.comm, self.mesh, self.env, self.record, self.probe = config, comm, mesh, env, record, probe
        self.ckpt_dir = str(ckpt_root.resolve())
        given = os.environ.get(ENV_LOCAL_DIR) or (str(config.local_dir) if config.local_dir else None)
        self.root = Path(given or rules.default_root(os.environ, getpass.getuser(), self.ckpt_dir))
        error = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            error = f"{self.root}: {exc.strerror or exc}"
        # ranks sharing a directory share a fate: a node is a host and its local directory
        self.nodes: tuple[str, ...] = tuple(comm.all_gather(f"{socket.gethostname()}:{self.root.resolve()}"))
        self.peers = rules.peers(self.nodes, config.local_replicas)
        self.active = True
        self._stager: Any = None
        errors = [e for e in comm.all_gather(error) if e]
        if errors:
            self._turn_off(f"no local directory ({errors[0]})")
        elif comm.is_coordinator and config.local_replicas and len(set(self.nodes)) < 2:
            log.warning("ckpt: local tier: all ranks share one node (%s): no peer copies, a lost node loses its local steps", self.root)

    def due(self, step: int) -> bool:
        """Whether ``step`` takes a fast-tier save: the tier is on and ``step`` is a multiple of
        ``local_every``. The same on every rank."""
        return self.active and self.config.local_every > 0 and step % self.config.local_every == 0

    def _turn_off(self, why: str) -> None:
        self.active = False
        if self.comm.is_coordinator:
            log.warning("ckpt: local tier off for this run: %s; the shared tier goes on", why)

    # ------------------------------------------------------------------ saving
    def stage(self, state: TrainingState) -> Any | None:
        """Main thread, collective: the rank's shards copied to CPU memory, or None (and the tier
        turned off) when a node lacks room for them and the copies it keeps."""
        if self._stager is None:  # torch's stager, as the shared tier's async save: CPU buffers kept and reused, pinned on GPUs
            accel = torch.cuda.is_available()
            options = StagingOptions(use_pinned_memory=accel, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=accel)
            self._stager = DefaultStager(options)
        with live_state(state.model, state.optimizer) as live:
            staged = self._stager.stage({"model": local_views(live.model_sd), "optim": local_views(live.optim_sd)})
        free = shutil.disk_usage(self.root).free
        sizes = self.comm.all_gather((tensor_bytes(staged), free))
        own = [s for s, _ in sizes]
        free_on = {n: f for n, (_, f) in zip(self.nodes, sizes, strict=True)}
        needs = {node: rules.room_needed(own, self.nodes, self.peers, node) for node in free_on}
        short = [(node, needs[node], free) for node, free in free_on.items() if needs[node] > free]
        if short:
            node, need, free_there = short[0]
            self._turn_off(f"{node.split(':', 1)[1]} has {free_there} bytes free, a local save needs about {need} (a tmpfs too small?)")
            return None
        return staged

    def measure(self, state: TrainingState, step: int) -> Probe | None:
        """Main thread, collective: the probe's values for this step (None without a probe)."""
        if self.probe is None:
            return None
        return measure(state.model, self.probe, float(state.optimizer.param_groups[0]["lr"]), step)

    def write(
        self,
        staged: Any,
        step: int,
        rank_json: bytes,
        run_id: str,
        batch: BatchConfig | None,
        shared_step: int | None,
        probe: Probe | None = None,
    ) -> None:
        """Save thread, collective: write, agree, copy to the peers, clean up. Never raises for
        a failed write: the tier is turned off and training goes on."""
        final = Path(rules.step_path(self.root, self.comm.rank, step))
        problem = None
        try:
            self._write_files(final, staged, step, rank_json, run_id, batch, probe)
        except (CheckpointException, OSError, CkptError) as exc:
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        problems = [p for p in self.comm.all_gather(problem) if p]
        if problems:
            shutil.rmtree(final, ignore_errors=True)
            self._turn_off(f"local save of step {step} failed: {problems[0]}")
            return
        payload = self._copy_of(self.comm.rank, step)
        received = local_wire.transfer(
            self.comm, [(p, payload) for p in self.peers[self.comm.rank]], list(rules.sources(self.peers, self.comm.rank))
        )
        kept = [self.comm.rank]
        for src, data in received.items():
            try:
                local_wire.keep(self.root, data)
                kept.append(src)
            except (CkptError, OSError) as exc:
                log.warning("ckpt: local tier: the copy of rank %d's step %d was not kept: %s", src, step, exc)
        try:
            own_bytes = sum(f.stat().st_size for f in final.iterdir())
        except OSError:
            own_bytes = 0  # only for the listing
        self.drop_old(shared_step)
        gathered = self.comm.all_gather((kept, own_bytes))
        holders: dict[str, list[int]] = {}
        for r, (ranks, _) in enumerate(gathered):
            holders.setdefault(self.nodes[r], []).extend(ranks)
        self._record(
            "local_saved",
            step=step,
            holders={node: sorted(ranks) for node, ranks in holders.items()},
            keep=self.config.local_keep,
            bytes=sum(b for _, b in gathered),
            world_size=self.comm.world_size,
            mesh=self.mesh.compact(),
            global_batch=batch.global_batch if batch is not None else None,
            created_at=time.time(),
        )

    def _copy_of(self, rank: int, step: int) -> bytearray:
        """``rank``'s files of ``step`` to send; a copy that cannot be read is sent as an empty
        buffer (the receiver refuses it as garbled), so that no receiver waits for it forever."""
        try:
            return local_wire.encode(Path(rules.step_path(self.root, rank, step)), rank, step)
        except OSError as exc:
            log.warning("ckpt: local tier: rank %d's step %d cannot be read to send: %s", rank, step, exc)
            return bytearray(8)

    def _record(self, event: str, **data: Any) -> None:
        if self.record is None or not self.comm.is_coordinator:
            return
        try:
            self.record(event, **data)
        except OSError as exc:  # a listing record is never worth a failed save
            log.warning("ckpt: local tier: could not record %s in the index: %s", event, exc)

    def _write_files(
        self, final: Path, staged: Any, step: int, rank_json: bytes, run_id: str, batch: BatchConfig | None, probe: Probe | None
    ) -> None:
        with directory_replaced(final) as partial:
            writer, fs = hashing_writer(partial, run_id, step, self.config.io_threads)
            with fs.writers_settled(), single_process_quietly():
                dcp.save(staged, storage_writer=writer, no_dist=True)
            entries = written_entries(
                partial, step, run_id, fs, self.comm.rank, rank_json, lambda name: not name.startswith(".") or name == ".metadata"
            )
            manifest = Manifest(
                run_id=run_id,
                step=step,
                created_at=time.time(),
                world_size=self.comm.world_size,
                files=tuple(entries),
                batch=batch,
                mesh=self.mesh,
                probe=probe,
                env={**self.env(), "local": {"rank": self.comm.rank, "ckpt_dir": self.ckpt_dir, "node": self.nodes[self.comm.rank]}},
            )
            atomic_write(partial / layout.MANIFEST_NAME, manifest.to_json().encode())

    def drop_old(self, shared_step: int | None) -> None:
        """Delete the local steps a resume would not take, in the directories this rank tends."""
        for rank, steps in self._held_steps().items():
            for step in rules.steps_to_drop(steps, self.config.local_keep, shared_step):
                shutil.rmtree(rules.step_path(self.root, rank, step), ignore_errors=True)

    def forget_after(self, step: int | None) -> None:
        """After a resume at ``step`` (None: a fresh start), the local steps after it belong to an
        abandoned past (a rollback, a step not complete on every rank): deleted, so that they are
        never mixed with the steps this run saves again."""
        gone = []
        for rank, steps in self._held_steps().items():
            for s in steps:
                if step is None or s > step:
                    shutil.rmtree(rules.step_path(self.root, rank, s), ignore_errors=True)
                    gone.append(f"rank {rank} step {s}")
        if gone:
            log.warning("ckpt: local tier: deleted what comes after the resume point (%s): %s", step, ", ".join(gone))

    def _held_steps(self) -> dict[int, list[int]]:
        """{rank: [steps]} of the rank directories this rank tends on its node."""
        out: dict[int, list[int]] = {}
        for entry in os.scandir(self.root) if self.root.is_dir() else []:
            rank = rules.parse_rank_dir_name(entry.name)
            if rank is None or not rules.checker(rank, self.comm.rank, self.nodes):
                continue
            steps = [layout.parse_step_dir_name(e.name) for e in os.scandir(entry.path)]
            out[rank] = [s for s in steps if s is not None]
        return out

    def close(self) -> None:
        """Release the staging buffers (no collective)."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def clean_up(self) -> None:
        """Collective, at the end of a run: this node's local steps are removed."""
        for rank in self._held_steps():
            shutil.rmtree(self.root / rules.rank_dir_name(rank), ignore_errors=True)
        self.comm.barrier()
        self._record("local_cleared")
        try:
            self.root.rmdir()
        except OSError:
            pass  # another node-mate's, or not empty: something that is not ours

    # ------------------------------------------------------------------ resuming
    def resume(self, state: TrainingState, newer_than: int | None, saved_after: float = 0.0) -> LocalResumed | None:
        """Collective: load the newest local step newer than ``newer_than`` (and saved after
        ``saved_after``: the shared tier's last rollback) whose every rank's files are held
        somewhere; None when there is none or it could not be used (the shared tier then serves)."""
        if not self.active:
            return None
        choice = rules.choose(self.comm.all_gather(self._valid_copies(newer_than, saved_after)), self.nodes, newer_than)
        if choice is None:
            return None
        me, step = self.comm.rank, choice.step
        fetches = choice.fetches(self.nodes)
        sends = [(r, self._copy_of(r, step)) for h, r in fetches if h == me]
        problem = None
        try:
            for data in local_wire.transfer(self.comm, sends, [h for h, r in fetches if r == me]).values():
                local_wire.keep(self.root, data)
            resumed = self._load(state, step)
            problem = self._verify(state, resumed)
        except (CkptError, OSError) as exc:
            problem, resumed = f"rank {me}: {getattr(exc, 'message', exc)}", None
        problems = [p for p in self.comm.all_gather(problem) if p]
        if problems:
            if self.comm.is_coordinator:
                log.warning("ckpt: local step %d could not be loaded (%s): resuming from the shared tier", step, problems[0])
            return None
        if self.comm.is_coordinator:
            moved = ", ".join(f"rank {r} from rank {h}" for h, r in fetches) or "none"
            log.warning(
                "ckpt: resumed from the local tier, step %d (newer than the shared tier's %s; copies sent: %s)", step, newer_than, moved
            )
        return resumed

    def _verify(self, state: TrainingState, resumed: LocalResumed) -> str | None:
        """The probe re-measured on the loaded model (collective): a failed check is a problem."""
        manifest = resumed.manifest
        if not self.config.verify_on_resume or self.probe is None or manifest.probe is None:
            return None
        report = verify_model(state.model, self.probe, manifest, resumed.rank_state, self.mesh)
        return None if report.ok else f"rank {self.comm.rank}: verify {'; '.join(report.failures())}"

    def _valid_copies(self, newer_than: int | None, saved_after: float) -> list[tuple[int, int]]:
        """(rank, step) of the copies this rank tends whose manifest fits this run and whose files
        pass the store's check (present, sizes, hashes)."""
        valid = []
        for rank, steps in self._held_steps().items():
            for step in steps:
                if newer_than is not None and step <= newer_than:
                    continue
                path = Path(rules.step_path(self.root, rank, step))
                try:
                    store = self._rank_store(rank)
                    if self._manifest(store, rank, step).created_at < saved_after:
                        log.warning("ckpt: local copy %s was saved before the shared tier's last rollback: not used", path)
                        continue
                    result = store.check_files(step)
                except (CkptError, OSError) as exc:
                    log.warning("ckpt: local copy %s not usable: %s", path, getattr(exc, "message", exc))
                    continue
                if not result.ok:
                    found = [*map(str, result.problems), *(f"{name}: not readable" for name in result.unreadable)]
                    log.warning("ckpt: local copy %s is damaged (%s): not used", path, "; ".join(found[:3]))
                    continue
                valid.append((rank, step))
        return valid

    def _rank_store(self, rank: int) -> CheckpointStore:
        """A rank's local steps are laid out as a checkpoint directory (``step_N/`` with its
        manifest): the store's reads and checks apply to them."""
        return CheckpointStore(self.root / rules.rank_dir_name(rank))

    def _manifest(self, store: CheckpointStore, rank: int, step: int) -> Manifest:
        """The manifest of ``rank``'s local ``step``, refused unless this run and mesh wrote it."""
        manifest, path = store.read_manifest(step), store.step_path(step)
        local = manifest.env.get("local")
        local = local if isinstance(local, dict) else {}
        if local.get("rank") != rank or local.get("ckpt_dir") != self.ckpt_dir:
            raise CkptError(f"{path} belongs to another run or place (rank {local.get('rank')}, {local.get('ckpt_dir')})")
        if manifest.world_size != self.comm.world_size or manifest.layout.dims != self.mesh.dims:
            raise CkptError(f"{path} was written on mesh {manifest.layout.describe()}, this run is {self.mesh.describe()}")
        return manifest

    def _load(self, state: TrainingState, step: int) -> LocalResumed:
        store = self._rank_store(self.comm.rank)
        path, manifest = store.step_path(step), self._manifest(store, self.comm.rank, step)
        verify = verifying(manifest, step)
        model, optimizer = state.model, state.optimizer
        if not optimizer.state:
            optimizer.zero_grad(set_to_none=True)  # as the shared resume: the state DCP loads into is built
        with live_state(model, optimizer) as live:
            target = {"model": local_views(live.model_sd), "optim": local_views(live.optim_sd)}
            load_state(target, path, no_dist=True, verify_with=verify, threads=self.config.io_threads)
            write_back(live.model_sd, target["model"])
            write_back(live.optim_sd, target["optim"])
            live.set_loaded()
        name = layout.rank_state_name(self.comm.rank)
        rank_state = state_codec.loads(verify.read_verified(path / name), str(path / name))
        return LocalResumed(step, manifest.run_id, manifest.batch, rank_state, manifest)
