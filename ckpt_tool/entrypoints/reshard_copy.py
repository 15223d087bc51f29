"""``ckpt reshard --out DIR2``: the copy laid out for the new world size, by one process or N ranks.

One process (``reshard_in_one_process``, the default when the state fits in memory): the source is
read once, whole (each file hash-checked as it is read), and DCP's save protocol runs for the N
new ranks in this process (``training.one_process_layout``). N ranks (``main``, run by torchrun
with the new world size, gloo): every rank builds empty targets from the source's DCP metadata
(no user model needed), sharded tensors as DTensors ``Shard(0)`` over the new ranks, scalars and
the probe batch replicated; DCP loads the source into them and each rank writes its own slice.
Both write the same files and commit them with the same protocol and hashes as any checkpoint.
DCP files hold global tensors, so this even split of every tensor loads on any mesh; the manifest
records the new mesh (``TP`` and data parallel the rest), which the resume plans against. Each
new rank's JSON state is taken as a resume on that mesh would take it
(``training.rank_state.read_rank_state``: keyed by mesh coordinates).

    torchrun --standalone --nproc-per-node N -m ckpt_tool.entrypoints.reshard_copy RESULT.json SRC STEP DST TP [MICRO_BATCH]
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.device_mesh import init_device_mesh

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.entrypoints import run_and_report
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.ops.reshard import ReshardReport, check_reshard
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.timing import span
from ckpt_tool.training import state_codec
from ckpt_tool.training.comm import Comm
from ckpt_tool.training.commit import commit_entries, commit_staged, staged_entries
from ckpt_tool.training.config import DEFAULT_IO_THREADS
from ckpt_tool.training.distributed import init_distributed
from ckpt_tool.training.hashing_fs import HashingFileSystem, hashing_writer, verifying
from ckpt_tool.training.one_process_layout import empty_targets, flatten_loaded, write_layout
from ckpt_tool.training.rank_state import read_rank_state
from ckpt_tool.training.safe_dcp import load_metadata_safely, load_state


@dataclass(frozen=True)
class _Copy:
    """One reshard copy: the source step, its check against the new mesh, the output store."""

    src: Path
    step: int
    manifest: Manifest
    report: ReshardReport
    verify_fs: HashingFileSystem
    metadata: Metadata
    world: int

    @classmethod
    def open(cls, src: Path, step: int, world: int, tp: int, micro: int | None) -> _Copy:
        store = CheckpointStore(src)
        manifest = store.read_manifest(step)
        report = check_reshard(store, step, world, micro, {"tp": tp})
        verify_fs = verifying(manifest, step)
        with verify_fs.create_stream(store.step_path(step) / layout.DCP_METADATA_NAME, "rb") as f:
            metadata = load_metadata_safely(f)
        return cls(src, step, manifest, report, verify_fs, metadata, world)

    @property
    def path(self) -> Path:
        return CheckpointStore(self.src).step_path(self.step)

    def rank_json(self, rank: int) -> bytes:
        return state_codec.dumps(read_rank_state(self.path, self.verify_fs, rank, self.report.new_mesh, self.manifest.layout))

    def writer(self, partial: Path) -> tuple[FileSystemWriter, HashingFileSystem]:
        return hashing_writer(partial, self.manifest.run_id, self.step, DEFAULT_IO_THREADS)

    def make_manifest(self, files: tuple[FileEntry, ...]) -> Manifest:
        lineage = (
            *self.manifest.lineage,
            {
                "event": "resharded_from",
                "time": time.time(),
                "source": str(self.src.absolute()),
                "step": self.step,
                "world_size": self.manifest.world_size,
            },
        )
        # env keeps what produced the state (the original world size): a resume compares against it
        return replace(
            self.manifest,
            files=files,
            world_size=self.world,
            batch=self.report.plan.new,
            mesh=self.report.new_mesh,
            lineage=lineage,
            created_at=time.time(),
        )


def main(argv: list[str]) -> int:
    """torchrun's entry for ``ckpt reshard --nproc``: ``argv`` is RESULT.json SRC STEP DST TP [MICRO_BATCH].
    Every rank loads its shard of SRC's ``step`` and saves it into DST laid out for this world size; rank
    0 writes the result or error to RESULT.json. Returns the exit code."""
    result_path, src, step, dst, tp = Path(argv[0]), Path(argv[1]), int(argv[2]), Path(argv[3]), int(argv[4])
    micro = int(argv[5]) if len(argv) > 5 else None
    init_distributed("gloo")
    comm = Comm()

    def body() -> dict[str, object]:
        try:
            reshard_copy(comm, src, step, dst, tp, micro)
        finally:
            comm.close()
        return {"step": step, "out": str(dst), "world_size": comm.world_size}

    return run_and_report(result_path, body)


def reshard_copy(comm: Comm, src: Path, step: int, dst: Path, tp: int, micro: int | None) -> None:
    """Rank ``comm.rank``'s part: load step ``step`` of ``src`` into targets laid out for this
    world size and commit it in ``dst``, for a mesh of tensor-parallel size ``tp`` and data
    parallel the rest."""
    copy = _Copy.open(src, step, comm.world_size, tp, micro)
    state = empty_targets(copy.metadata, init_device_mesh("cpu", (comm.world_size,)))
    with span("reshard.load"):
        load_state(state, copy.path, process_group=comm.group, verify_with=copy.verify_fs)
    rank_json = copy.rank_json(comm.rank)

    def create() -> None:
        CheckpointStore(dst, create=True)

    comm.on_coordinator(create)
    out = CheckpointStore(dst)
    writer, fs = copy.writer(out.begin_staging(step))
    with span("reshard.write"), fs.writers_settled():
        dcp.save(state, storage_writer=writer, process_group=comm.group)
    with span("reshard.commit"):
        commit_staged(out, comm, step, copy.manifest.run_id, fs, rank_json, copy.make_manifest)


def reshard_in_one_process(src: Path, step: int, dst: Path, world: int, tp: int, micro: int | None, threads: int) -> None:
    """The same copy as ``world`` ranks running ``reshard_copy`` write, by this process alone:
    the source read once, whole (``threads`` files at a time), then every new rank's file
    written. On failure nothing is left in ``dst`` (a directory this call made is removed)."""
    copy = _Copy.open(src, step, world, tp, micro)
    state = empty_targets(copy.metadata, None)
    with span("reshard.load"):
        load_state(state, copy.path, no_dist=True, verify_with=copy.verify_fs, threads=threads)
    made = not dst.exists()
    out = CheckpointStore(dst, create=True)
    writer, fs = copy.writer(out.begin_staging(step))
    try:
        with span("reshard.write"), fs.writers_settled():
            write_layout(flatten_loaded(state, copy.metadata), copy.metadata.planner_data or {}, world, writer)
        run_id = copy.manifest.run_id
        with span("reshard.commit"):
            entries = [e for rank in range(world) for e in staged_entries(out, step, run_id, fs, rank, copy.rank_json(rank))]
            commit_entries(out, Comm(), step, entries, copy.make_manifest)
    except BaseException as exc:
        out.discard_staging(step)
        if made:
            shutil.rmtree(dst, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CkptError(
                f"writing the resharded copy to {dst} failed: {exc}",
                "free space there or give another --out; the source checkpoint is unchanged",
                ExitCode.FAILED,
            ) from None
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
