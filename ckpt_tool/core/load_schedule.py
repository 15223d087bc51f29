"""Who reads which checkpoint file, and who sends what to whom, so that a load reads each byte
once however many ranks need it. Pure.

A DCP load gives every rank a list of stored items it needs: (file, offset, length) ranges of
the checkpoint's files. A replicated entry (DDP, HSDP's ``dp_replicate``, a TP-replicated
parameter, the optimizer's step counters) is stored once and needed by several ranks; without a
schedule each of them reads its whole file (the file is hash-checked whole, so a rank that needs
one item of a file reads all of it). Here each file needed by anyone gets one reader, chosen
among the ranks that need something from it: the one that needs the most of it (a shard's owner
reads its shard), ties to the rank with the fewest bytes to read so far (DDP's copies spread over
the ranks), then the lowest rank. The reader hash-checks the file as it reads it; every item of
it that other ranks need becomes a ``Transfer`` from the reader to them, in one order that every
rank computes alike from the same needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ItemKey = tuple[str, int, int]  # (file, offset, length) of one stored item


@dataclass(frozen=True)
class Transfer:
    """One stored item sent by the rank that read its file to the ranks that need it too."""

    item: ItemKey
    reader: int
    consumers: tuple[int, ...]  # sorted, without the reader


@dataclass(frozen=True)
class LoadSchedule:
    """Each needed file's reader, and the transfers in the order every rank carries them out."""

    readers: Mapping[str, int]
    transfers: tuple[Transfer, ...]

    def files_read_by(self, rank: int) -> list[str]:
        """The files ``rank`` reads (and hash-checks), sorted."""
        return sorted(f for f, r in self.readers.items() if r == rank)

    def bytes_read_by(self, rank: int, file_bytes: Mapping[str, int]) -> int:
        """What ``rank`` reads from storage under this schedule."""
        return sum(file_bytes[f] for f in self.files_read_by(rank))


def plan_load(needs: Sequence[Sequence[ItemKey]], file_bytes: Mapping[str, int]) -> LoadSchedule:
    """The schedule for ranks ``0..len(needs)-1`` where ``needs[r]`` are the items rank ``r``
    needs and ``file_bytes`` each file's size (a file missing there counts as its items' bytes)."""
    wanted: dict[str, dict[int, int]] = {}  # file -> rank -> bytes of it the rank needs
    consumers: dict[ItemKey, set[int]] = {}
    for rank, items in enumerate(needs):
        for item in set(items):
            file, _, length = item
            per_rank = wanted.setdefault(file, {})
            per_rank[rank] = per_rank.get(rank, 0) + length
            consumers.setdefault(item, set()).add(rank)

    def size(file: str) -> int:
        return file_bytes.get(file, sum(length for (f, _, length) in consumers if f == file))

    load = [0] * len(needs)
    readers: dict[str, int] = {}
    for file in sorted(wanted, key=lambda f: (-size(f), f)):  # the largest first: the balance is decided on them
        reader = min(wanted[file], key=lambda r: (-wanted[file][r], load[r], r))
        readers[file] = reader
        load[reader] += size(file)
    transfers = tuple(
        Transfer(item, readers[item[0]], tuple(sorted(ranks - {readers[item[0]]})))
        for item, ranks in sorted(consumers.items())
        if ranks - {readers[item[0]]}
    )
    return LoadSchedule(readers, transfers)
