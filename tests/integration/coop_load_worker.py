"""Run under torchrun by test_cooperative_load.py: save a state of every kind of entry with DCP
through the hashing filesystem, then load it back with ``load_state`` (cooperatively or not) into
fresh targets and compare. ``--layout``: ddp (plain replicated tensors), fsdp (sharded DTensors),
hsdp (replicate 2 x shard). ``--damage FILE``: that file gets a flipped byte between the save and
the load. Each rank writes its outcome to ``rank<R>.txt`` beside ``--dir``: ``equal``, ``differs in [...]``
or ``CkptError: ...``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from ckpt_tool.core.manifest import FileEntry
from ckpt_tool.errors import CkptError
from ckpt_tool.training import verified_reader
from ckpt_tool.training.hashing_fs import HashingFileSystem
from ckpt_tool.training.safe_dcp import load_state


def seed(name: str) -> int:
    return len(name) * 7919


def state(layout: str, world: int, fill: float | None = None) -> dict:
    g = torch.Generator().manual_seed(0)
    full = {
        "w": torch.randn(256, 256, generator=g),  # 256 KiB: the header look-ahead is small beside it
        "b": torch.randn(256, generator=g),
        "half": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "ids": torch.arange(10, dtype=torch.int64),
        "scalar": torch.tensor(3.0),
        "transposed": torch.randn(6, 5, generator=g).t(),  # saved with its strides: sent whole, torch's path
    }
    if fill is not None:
        full = {k: torch.full_like(v, fill) for k, v in full.items()}
    out: dict = {**full, "hyper": {"lr": 0.0 if fill is not None else 0.1, "betas": [0.9, 0.95]}}
    if layout != "ddp":
        shape, names, placements = (
            ((world,), ("dp_shard",), [Shard(0)])
            if layout == "fsdp"
            else ((2, world // 2), ("dp_replicate", "dp_shard"), [Replicate(), Shard(0)])
        )
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for k in ("w", "b", "half"):
            out[k] = distribute_tensor(full[k], mesh, placements)
    return out


def local(v: torch.Tensor) -> torch.Tensor:
    return v.to_local() if isinstance(v, DTensor) else v


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--layout", choices=("ddp", "fsdp", "hsdp"), required=True)
    p.add_argument("--no-cooperative", action="store_true")
    p.add_argument("--auto", action="store_true", help="leave the choice to load_state (cooperative across nodes)")
    p.add_argument("--node-per-rank", action="store_true", help="each rank names itself another node (SLURMD_NODENAME)")
    p.add_argument("--damage")
    p.add_argument("--chunk-bytes", type=int)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.node_per_rank:
        os.environ["SLURMD_NODENAME"] = f"node{rank}"
    if args.chunk_bytes:
        verified_reader.CHUNK_BYTES = args.chunk_bytes
    fs = HashingFileSystem(seed)
    writer = FileSystemWriter(args.dir, single_file_per_rank=True, thread_count=1)
    writer.fs = fs
    dcp.save(state(args.layout, world), storage_writer=writer)
    written: list = [None] * world
    dist.all_gather_object(written, {n: (d.bytes, d.hash) for n, d in fs.written.items()})
    entries = {n: FileEntry(n, b, h, 0) for w in written for n, (b, h) in w.items()}
    if rank == 0 and args.damage:
        link = args.dir.parent / "damage-link"  # through another name: the flip's own read is not the load's
        link.hardlink_to(args.dir / args.damage)
        with open(link, "r+b") as f:
            f.seek(entries[args.damage].bytes // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x10]))
    if rank == 0:
        (args.dir.parent / "entries.json").write_text(json.dumps({n: e.bytes for n, e in entries.items()}))
    dist.barrier()
    target = state(args.layout, world, fill=7.0)
    try:
        load_state(
            target, args.dir, verify_with=HashingFileSystem(seed, entries), cooperative=None if args.auto else not args.no_cooperative
        )
    except CkptError as exc:
        (args.dir.parent / f"rank{rank}.txt").write_text(f"CkptError: {exc.message}")
        dist.destroy_process_group()
        return 3
    source = state(args.layout, world)
    unequal = [
        k for k, v in source.items() if (not torch.equal(local(v), local(target[k])) if isinstance(v, torch.Tensor) else v != target[k])
    ]
    (args.dir.parent / f"rank{rank}.txt").write_text("equal" if not unequal else f"differs in {unequal}")
    dist.destroy_process_group()
    return 0 if not unequal else 1


if __name__ == "__main__":
    sys.exit(main())
