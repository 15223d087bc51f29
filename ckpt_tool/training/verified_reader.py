"""Loading a checkpoint near disk speed: one sequential pass per file, hashed as it streams into
the destination tensors.

torch's ``FileSystemReader.read_data`` takes one file at a time in one thread and, for every
item, slices it out of the file, ``torch.load``s the slice and copies the result into the target.
Here each file is read once, front to back, in large chunks into one reused buffer, by a pool of
threads (one file each): every chunk feeds the file's xxh3 hash and, where it holds the raw bytes
of a tensor, is copied straight into the destination (``core.tensor_record`` reads each item's
layout from its zip directory and pickle, without running them). Memory beyond the state: the
chunk buffer per thread, one tensor row at a chunk boundary, and the items that take torch's own
path (non-tensor entries, and tensors whose record is not a plain row-major one), kept until
their file is verified.

Nothing is used before it is checked: at the end of each file its size and hash are compared
with the manifest, and only then are the buffered items deserialized (``weights_only=True``) and
the load reported complete; a mismatch raises ``CkptError`` naming the file, and the resume
quarantines the checkpoint (the tensors it half-filled are loaded again from the previous one).
The few header bytes read ahead to find the layouts are compared with the same bytes in the
hashed pass, so what was parsed is what was verified. The files are DCP's own: ``dcp.load`` and
``dcp_to_torch_save`` read them unchanged.

Cooperatively (given the load's process group): each byte is read from storage once per job. The
ranks exchange the items they need, ``core.load_schedule`` gives every needed file one reader,
and each rank reads, hash-checks and loads its own files as above (in parallel with the others),
keeping the raw bytes of the items other ranks need (its own destination holds them when it
needs the item whole; else a staging copy). The ranks then agree (one gather) that every file
matched its manifest entry, with the layout of each item to send, and the items go to the ranks
that need them in the schedule's order, in chunks of ``chunk_bytes`` (broadcast when every rank
takes part, else sent to each), received straight into the destination when it is the item's
whole bytes. A file that does not match stops the exchange before anything is sent: the rank
that read it raises its ``CkptError``, the others return, and DCP raises it on every rank.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import xxhash
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from ckpt_tool.core.load_schedule import ItemKey, LoadSchedule, Transfer, plan_load
from ckpt_tool.core.tensor_record import TensorRecord, parse_tensor_pickle
from ckpt_tool.timing import span
from ckpt_tool.training.hashing_fs import HashingFileSystem
from ckpt_tool.training.safe_dcp import SafeFileSystemReader

CHUNK_BYTES = 8 << 20


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of bytes ``[start, start + length)`` of ``fd`` that remembers what it read."""

    def __init__(self, fd: int, start: int, length: int, seen: list[tuple[int, bytes]]) -> None:
        super().__init__()
        self.fd, self.start, self.length, self.pos, self.seen = fd, start, length, 0, seen

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        data = os.pread(self.fd, n, self.start + self.pos) if n else b""
        b[: len(data)] = data
        if data:
            self.seen.append((self.start + self.pos, data))
        self.pos += len(data)
        return len(data)


@dataclass
class _Tensor:
    """Copies the raw bytes of one row-major tensor record into its destination as they stream by."""

    req: ReadItem
    record: TensorRecord
    target: torch.Tensor
    start: int  # offset in the file of the storage's first byte
    carry: bytearray = field(default_factory=bytearray)
    done: int = 0  # bytes of the storage consumed

    def __post_init__(self) -> None:
        r = self.record
        self.shape = r.size if r.size else (1,)
        self.row_bytes = r.itemsize * max(1, math.prod(self.shape[1:]))
        self.dtype = getattr(torch, r.dtype)
        offsets, lengths = list(self.req.storage_offsets) or [0], list(self.req.lengths) or [1]
        self.first, self.count, self.inner = offsets[0], lengths[0], list(zip(offsets[1:], lengths[1:], strict=True))
        self.dest = self.target if self.target.dim() else self.target.view(1)

    @property
    def end(self) -> int:
        return self.start + self.record.nbytes

    def feed(self, view: memoryview) -> None:
        if self.carry:
            take = view[: self.row_bytes - len(self.carry)]
            self.carry += take
            view = view[len(take) :]
            if len(self.carry) == self.row_bytes:
                self._rows(memoryview(self.carry))
                self.carry = bytearray()
        whole = len(view) // self.row_bytes * self.row_bytes
        if whole:
            self._rows(view[:whole])
        if whole < len(view):
            self.carry += view[whole:]

    def _rows(self, data: memoryview) -> None:
        r0 = self.done // self.row_bytes
        n = len(data) // self.row_bytes
        self.done += len(data)
        a, b = max(r0, self.first), min(r0 + n, self.first + self.count)
        if a >= b:
            return
        src = torch.frombuffer(data, dtype=self.dtype, count=n * self.row_bytes // self.record.itemsize).view(n, *self.shape[1:])
        piece = src[a - r0 : b - r0]
        for dim, (offset, length) in enumerate(self.inner, start=1):
            piece = piece.narrow(dim, offset, length)
        self.dest[a - self.first : b - self.first].copy_(piece)


@dataclass
class _Direct:
    """A tensor whose destination is exactly its saved bytes (same dtype, whole, contiguous, in
    host memory): the file is read straight into the destination's memory and hashed there."""

    req: ReadItem
    record: TensorRecord
    target: torch.Tensor
    start: int
    end: int
    filled: int = 0  # bytes fed so far (the receiving side of a cooperative load)

    @property
    def memory(self) -> memoryview:
        flat = self.target.reshape(-1) if self.target.dim() else self.target.view(1)
        return memoryview(flat.view(torch.uint8).numpy())

    def feed(self, view: memoryview) -> None:
        self.memory[self.filled : self.filled + len(view)] = view
        self.filled += len(view)


@dataclass
class _Check:
    """Header bytes read ahead to find a layout: the hashed pass must see the same bytes."""

    start: int
    data: bytes
    done: int = 0
    differs: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def feed(self, view: memoryview) -> None:
        self.differs |= view != self.data[self.done : self.done + len(view)]
        self.done += len(view)


@dataclass
class _Buffered:
    """An item that takes torch's own path: its bytes are kept until the file is verified (``req``
    None: bytes staged for other ranks, ``Cooperation``)."""

    req: ReadItem | None
    start: int
    length: int
    data: bytearray = field(default_factory=bytearray)

    @property
    def end(self) -> int:
        return self.start + self.length

    def feed(self, view: memoryview) -> None:
        self.data += view


@dataclass(frozen=True)
class _Layout:
    """What of a stored item goes to the other ranks that need it: the raw bytes of its tensor
    (``record``) or, ``record`` None, the item's whole bytes (torch's own path at the receiver);
    ``start`` is their offset in the file."""

    record: TensorRecord | None
    start: int
    nbytes: int


@dataclass
class _FileRead:
    """One file read by this rank: its own destinations filled (``tensors``) or bytes kept
    (``buffered``), and for each item other ranks need, what they get and where this rank has it
    (its own destination holding exactly those bytes, or a staging copy)."""

    tensors: list[_Tensor | _Direct]
    buffered: list[_Buffered]
    sources: dict[ItemKey, tuple[_Layout, _Direct | _Buffered]] = field(default_factory=dict)


class StreamingVerifiedReader(SafeFileSystemReader):
    """``FileSystemReader`` whose ``read_data`` verifies and loads as described in the module docstring;
    cooperatively over ``group`` when it is given and has more than one rank."""

    def __init__(
        self, path: Path, verify_with: HashingFileSystem, threads: int = 4, chunk_bytes: int | None = None, group: Any = None
    ) -> None:
        super().__init__(path)
        self.fs = verify_with
        self.verify_with, self.threads, self.chunk_bytes = verify_with, max(1, threads), chunk_bytes or CHUNK_BYTES
        self.group = group

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        """Load ``plan``'s items, one thread per file: each file streamed, hashed and checked against the manifest
        before its buffered items are loaded. Returns a completed future; raises ``CkptError`` naming a file whose
        size or hash does not match."""
        mine: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            mine.setdefault(self._key(item)[0], []).append(item)
        if self.group is None or dist.get_world_size(self.group) == 1:
            self._finish(self._read_files([(name, reqs, []) for name, reqs in mine.items()], planner), planner)
        else:
            self._read_cooperatively(plan, mine, planner)
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """torch's set-up, and an index of the stored items by (file, offset, length)."""
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._by_key = {(i.relative_path, i.offset, i.length): (index, i) for index, i in self.storage_data.items()}

    def _key(self, req: ReadItem) -> ItemKey:
        info = self.storage_data[req.storage_index]
        return (info.relative_path, info.offset, info.length)

    def _read_files(self, jobs: list[tuple[str, list[ReadItem], list[ItemKey]]], planner: LoadPlanner) -> list[_FileRead]:
        """Read each job's file (its items for this rank, the items to keep for others), ``threads`` files at once."""
        resolve = planner.resolve_tensor

        def one(job: tuple[str, list[ReadItem], list[ItemKey]]) -> _FileRead:
            return self._read_file(Path(self.fs.concat_path(self.path, job[0])), job[1], resolve, job[2])

        if len(jobs) <= 1 or self.threads == 1:
            return [one(job) for job in jobs]
        with ThreadPoolExecutor(min(self.threads, len(jobs)), thread_name_prefix="ckpt-load") as pool:
            return list(pool.map(one, jobs))

    def _finish(self, reads: list[_FileRead], planner: LoadPlanner) -> None:
        """Every file is verified: now the buffered items may be read, and the tensors are committed."""
        for read in reads:
            for item in read.buffered:
                self._load_buffered(item, planner)
            for sink in read.tensors:
                planner.commit_tensor(sink.req, sink.target)

    # ------------------------------------------------------------------ cooperatively
    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """On the coordinator, with every rank's plan (DCP gathered them): when cooperative, the
        ``LoadSchedule`` of their items rides to every rank in its plan's ``storage_data``."""
        plans = super().prepare_global_plan(plans)
        if self.group is None or len(plans) == 1:
            return plans
        file_bytes = {name: entry.bytes for name, entry in (self.verify_with.expected or {}).items()}
        schedule = plan_load([[self._key(item) for item in plan.items] for plan in plans], file_bytes)
        return [dataclasses.replace(plan, storage_data=schedule) for plan in plans]

    def _read_cooperatively(self, plan: LoadPlan, mine: dict[str, list[ReadItem]], planner: LoadPlanner) -> None:
        group = self.group
        me, world = dist.get_rank(group), dist.get_world_size(group)
        schedule = plan.storage_data
        if not isinstance(schedule, LoadSchedule):
            raise AssertionError(f"the cooperative load found no schedule in its plan ({type(schedule).__name__})")
        error: BaseException | None = None
        sources: dict[ItemKey, tuple[_Layout, _Direct | _Buffered]] = {}
        try:
            to_send: dict[str, list[ItemKey]] = {}
            for transfer in schedule.transfers:
                if transfer.reader == me:
                    to_send.setdefault(transfer.item[0], []).append(transfer.item)
            reads = self._read_files([(f, mine.get(f, []), to_send.get(f, [])) for f in schedule.files_read_by(me)], planner)
            self._finish(reads, planner)
            sources = {key: source for read in reads for key, source in read.sources.items()}
        except Exception as exc:  # noqa: BLE001 - any failure: the others must hear of it before they exchange
            error = exc
        agreed: list[Any] = [None] * world
        dist.all_gather_object(agreed, (error is not None, {key: layout for key, (layout, _) in sources.items()}), group=group)
        if error is not None:
            raise error
        if any(failed for failed, _ in agreed):
            return  # the rank whose file failed raises it; DCP raises it on every rank
        layouts = {key: layout for _, sent in agreed for key, layout in sent.items()}
        receiving: dict[ItemKey, list[_Tensor | _Direct | _Buffered]] = {}
        for name, reqs in mine.items():
            if schedule.readers.get(name) != me:
                for req in reqs:
                    key = self._key(req)
                    receiving.setdefault(key, []).append(self._receiving_sink(req, layouts[key], planner.resolve_tensor))
        with span("load.exchange"):
            for (reader, consumers), items in _streams(schedule.transfers):
                if me == reader:
                    self._stream_out(reader, consumers, [(layouts[i], sources[i][1]) for i in items])
                elif me in consumers:
                    self._stream_in(reader, consumers, [(layouts[i], receiving[i]) for i in items])
        for sinks in receiving.values():
            for sink in sinks:
                if isinstance(sink, _Buffered):
                    self._load_buffered(sink, planner)
                else:
                    if isinstance(sink, _Tensor) and (sink.done != sink.record.nbytes or sink.carry):
                        raise AssertionError(f"{sink.req.storage_index.fqn} got {sink.done} of {sink.record.nbytes} bytes")
                    planner.commit_tensor(sink.req, sink.target)

    def _pass_on(self, chunk: torch.Tensor, reader: int, consumers: tuple[int, ...]) -> None:
        """``chunk`` from ``reader`` to ``consumers``: one broadcast when every rank takes part,
        else a send to each (the other ranks are not involved)."""
        group = self.group
        source = dist.get_global_rank(group, reader)
        if len(consumers) + 1 == dist.get_world_size(group):
            dist.broadcast(chunk, src=source, group=group)
        elif dist.get_rank(group) == reader:
            for consumer in consumers:
                dist.send(chunk, dst=dist.get_global_rank(group, consumer), group=group)
        else:
            dist.recv(chunk, src=source, group=group)

    def _stream_out(self, reader: int, consumers: tuple[int, ...], items: list[tuple[_Layout, _Direct | _Buffered]]) -> None:
        """The items one after the other as one stream of bytes, sent in chunks of ``chunk_bytes``."""
        raws = [
            _raw_bytes(src.target) if isinstance(src, _Direct) else torch.frombuffer(src.data, dtype=torch.uint8)
            for layout, src in items
            if layout.nbytes
        ]
        sizes = [layout.nbytes for layout, _ in items if layout.nbytes]
        buffer = torch.empty(min(self.chunk_bytes, sum(sizes)), dtype=torch.uint8)
        for n, pieces in _pieces(sizes, self.chunk_bytes):
            for item, at, to, take in pieces:
                buffer[to : to + take].copy_(raws[item][at : at + take])
            self._pass_on(buffer[:n], reader, consumers)

    def _stream_in(self, reader: int, consumers: tuple[int, ...], items: list[tuple[_Layout, list[Any]]]) -> None:
        """``_stream_out``'s chunks received into one buffer, each item's part fed to its sinks."""
        sinks = [item_sinks for layout, item_sinks in items if layout.nbytes]
        sizes = [layout.nbytes for layout, _ in items if layout.nbytes]
        buffer = torch.empty(min(self.chunk_bytes, sum(sizes)), dtype=torch.uint8)
        for n, pieces in _pieces(sizes, self.chunk_bytes):
            self._pass_on(buffer[:n], reader, consumers)
            view = memoryview(buffer.numpy())
            for item, _, at, take in pieces:
                for sink in sinks[item]:
                    sink.feed(view[at : at + take])

    def _receiving_sink(self, req: ReadItem, layout: _Layout, resolve: Callable[[ReadItem], torch.Tensor]) -> _Tensor | _Direct | _Buffered:
        if layout.record is None:
            return _Buffered(req, 0, layout.nbytes)
        target = resolve(req).detach()
        if tuple(target.shape) != tuple(req.lengths):
            raise AssertionError(f"req {req.storage_index} mismatch sizes {tuple(target.shape)} vs {tuple(req.lengths)}")
        return _tensor_sink(req, layout.record, target, 0)

    # ------------------------------------------------------------------ one file
    def _read_file(
        self, path: Path, reqs: list[ReadItem], resolve: Callable[[ReadItem], torch.Tensor], keep: Sequence[ItemKey] = ()
    ) -> _FileRead:
        entry = self.verify_with.entry_for(path)
        fd = self.verify_with.open_for_reading(path)
        try:
            size = os.fstat(fd).st_size
            if size != entry.bytes:
                self.verify_with.mismatch(path, entry, size, "not read: the size differs")
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            seen: list[tuple[int, bytes]] = []
            sinks: list[_Tensor | _Direct | _Buffered] = [self._sink(fd, req, resolve, seen) for req in reqs]
            sources = self._sources(fd, keep, sinks, seen)
            stages = [s for _, s in sources.values() if isinstance(s, _Buffered)]
            checks = [_Check(start, data) for start, data in seen]
            with span("load.read_file"):
                digest, nread = self._stream(fd, size, sorted([*sinks, *stages, *checks], key=lambda s: s.start), path)
        finally:
            os.close(fd)
        self.verify_with.check(path, entry, nread, digest)
        for sink in sinks:
            if isinstance(sink, _Tensor) and (sink.done != sink.record.nbytes or sink.carry):
                raise AssertionError(f"{path}: {sink.req.storage_index.fqn} got {sink.done} of {sink.record.nbytes} bytes")
        return _FileRead([s for s in sinks if not isinstance(s, _Buffered)], [s for s in sinks if isinstance(s, _Buffered)], sources)

    def _sources(
        self, fd: int, keep: Sequence[ItemKey], sinks: list[_Tensor | _Direct | _Buffered], seen: list[tuple[int, bytes]]
    ) -> dict[ItemKey, tuple[_Layout, _Direct | _Buffered]]:
        """For each item other ranks need from this file: what they get, and where it will be once
        read (this rank's own destination when it holds exactly those bytes, else a staging copy)."""
        holders = {self._key(s.req): s for s in sinks if not isinstance(s, _Buffered)}  # their layout is known
        sources: dict[ItemKey, tuple[_Layout, _Direct | _Buffered]] = {}
        for key in keep:
            holder = holders.get(key)
            if holder is not None:
                layout = _Layout(holder.record, holder.start, holder.record.nbytes)
            else:
                index, info = self._by_key[key]
                raw_only = index.offset is None or bool(info.transform_descriptors)  # bytes entries have no chunk offset
                located = None if raw_only else _locate_tensor(fd, info.offset, info.length, seen)
                layout = _Layout(None, info.offset, info.length) if located is None else _Layout(located[0], located[1], located[0].nbytes)
            # this rank's own destination when it holds exactly those bytes, else a copy kept as they stream by
            sources[key] = (layout, holder if isinstance(holder, _Direct) else _Buffered(None, layout.start, layout.nbytes))
        return sources

    def _sink(
        self, fd: int, req: ReadItem, resolve: Callable[[ReadItem], torch.Tensor], seen: list[tuple[int, bytes]]
    ) -> _Tensor | _Direct | _Buffered:
        info = self.storage_data[req.storage_index]
        if req.type == LoadItemType.BYTE_IO or info.transform_descriptors:
            return _Buffered(req, info.offset, info.length)
        located = _locate_tensor(fd, info.offset, info.length, seen)
        if located is None:
            return _Buffered(req, info.offset, info.length)
        record, data_start = located
        target = resolve(req).detach()
        if tuple(target.shape) != tuple(req.lengths):  # torch's path raises its own message for this
            return _Buffered(req, info.offset, info.length)
        return _tensor_sink(req, record, target, data_start)

    def _stream(self, fd: int, size: int, sinks: list[Any], path: Path) -> tuple[str, int]:
        """One pass over the file: straight into the destinations of ``_Direct`` sinks, through
        the chunk buffer for the rest; every byte hashed in order."""
        pump = _Pump(
            self.verify_with.seed_for(path.name),
            min(self.chunk_bytes, max(size, 1)),
            [s for s in sinks if not isinstance(s, _Direct)],
        )
        with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
            for direct in (s for s in sinks if isinstance(s, _Direct)):
                pump.run(f, direct.start)
                if pump.pos == direct.start:
                    pump.pos += pump.fill(f, direct.memory)
            pump.run(f, None)
        if any(isinstance(s, _Check) and s.differs for s in sinks):
            self.verify_with.mismatch(path, self.verify_with.entry_for(path), size, "changed while it was read")
        return pump.hasher.hexdigest(), pump.pos

    def _load_buffered(self, item: _Buffered, planner: LoadPlanner) -> None:
        assert item.req is not None, "a staging copy is sent, not loaded"
        stream = io.BytesIO(item.data)
        if item.req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item.req, stream)
            return
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, item.req.storage_offsets, item.req.lengths)
        target = planner.resolve_tensor(item.req).detach()
        if target.size() != tensor.size():
            raise AssertionError(f"req {item.req.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
        target.copy_(tensor)
        planner.commit_tensor(item.req, target)


class _Pump:
    """Reads a file in chunks through one buffer, hashing every byte and handing each sink (sorted
    by start; ranges may overlap) its part of the chunk."""

    def __init__(self, seed: int, chunk_bytes: int, sinks: list[Any]) -> None:
        self.hasher = xxhash.xxh3_128(seed=seed)
        self.buf = bytearray(chunk_bytes)
        self.view = memoryview(self.buf)
        self.sinks = sinks
        self.pos, self.first_sink = 0, 0

    def fill(self, f: Any, memory: memoryview) -> int:
        """Read into ``memory`` (a destination), hash it; returns the bytes read (short at EOF)."""
        got = 0
        while got < len(memory):
            n = f.readinto(memory[got:])
            if not n:
                break
            got += n
        self.hasher.update(memory[:got])
        return got

    def run(self, f: Any, until: int | None) -> None:
        """Chunks from ``pos`` up to ``until`` (None: the end of the file)."""
        while until is None or self.pos < until:
            want = len(self.buf) if until is None else min(len(self.buf), until - self.pos)
            n = f.readinto(self.view[:want])
            if not n:
                return
            self._dispatch(self.view[:n])

    def _dispatch(self, chunk: memoryview) -> None:
        pos, end = self.pos, self.pos + len(chunk)
        self.hasher.update(chunk)
        while self.first_sink < len(self.sinks) and self.sinks[self.first_sink].end <= pos:
            self.first_sink += 1
        for sink in self.sinks[self.first_sink :]:
            if sink.start >= end:
                break
            a, b = max(pos, sink.start), min(end, sink.end)
            if a < b:
                sink.feed(chunk[a - pos : b - pos])
        self.pos = end


def _pieces(sizes: list[int], chunk_bytes: int) -> Iterator[tuple[int, list[tuple[int, int, int, int]]]]:
    """Items of ``sizes`` bytes (each > 0) one after the other, cut in chunks of ``chunk_bytes``: per
    chunk, its length and its pieces as (item, offset in the item, offset in the chunk, length)."""
    total, item, done = sum(sizes), 0, 0
    for a in range(0, total, chunk_bytes):
        n, used, pieces = min(chunk_bytes, total - a), 0, []
        while used < n:
            take = min(sizes[item] - done, n - used)
            pieces.append((item, done, used, take))
            used, done = used + take, done + take
            if done == sizes[item]:
                item, done = item + 1, 0
        yield n, pieces


def _streams(transfers: tuple[Transfer, ...]) -> list[tuple[tuple[int, tuple[int, ...]], list[ItemKey]]]:
    """The transfers as streams: one per (reader, consumers), in the order of each's first transfer,
    its items in the schedule's order (one collective per chunk of a stream, not one per item)."""
    streams: dict[tuple[int, tuple[int, ...]], list[ItemKey]] = {}
    for t in transfers:
        streams.setdefault((t.reader, t.consumers), []).append(t.item)
    return list(streams.items())


def _tensor_sink(req: ReadItem, record: TensorRecord, target: torch.Tensor, start: int) -> _Tensor | _Direct:
    """A destination filled from the raw bytes of ``record`` starting at ``start``: read straight
    into it when it takes them whole (same dtype, contiguous, in host memory), else through the
    chunk buffer (narrowed, converted, or on a device)."""
    whole = tuple(req.lengths) == record.size and not any(req.storage_offsets)
    in_place = whole and target.device.type == "cpu" and target.is_contiguous() and str(target.dtype) == f"torch.{record.dtype}"
    if in_place and record.nbytes:
        return _Direct(req, record, target, start, start + record.nbytes)
    return _Tensor(req, record, target, start)


def _raw_bytes(target: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor's bytes, as a flat uint8 view of it."""
    return (target.reshape(-1) if target.dim() else target.view(1)).view(torch.uint8)


def _locate_tensor(fd: int, start: int, length: int, seen: list[tuple[int, bytes]]) -> tuple[TensorRecord, int] | None:
    """The record of the ``torch.save`` zip at ``[start, start + length)`` and the file offset of
    its raw storage bytes, or None when it is not a plain row-major tensor of a little-endian writer."""
    try:
        view = _RangeFile(fd, start, length, seen)
        with zipfile.ZipFile(view) as z:
            names = {i.filename.split("/", 1)[-1]: i for i in z.infolist()}
            storage, pkl, order = names.get("data/0"), names.get("data.pkl"), names.get("byteorder")
            if storage is None or pkl is None or storage.compress_type != zipfile.ZIP_STORED or pkl.file_size > 64 << 10:
                return None
            if order is not None and z.read(order) != b"little":
                return None
            record = parse_tensor_pickle(z.read(pkl))
            if record is None or not record.row_major or storage.file_size != record.nbytes:
                return None
            header = bytearray(30)
            view.seek(storage.header_offset)
            if view.readinto(header) != 30 or header[:4] != b"PK\x03\x04":
                return None
            name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
            data_start = storage.header_offset + 30 + name_len + extra_len
            if data_start + record.nbytes > length:
                return None
            return record, start + data_start
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, EOFError):
        return None
