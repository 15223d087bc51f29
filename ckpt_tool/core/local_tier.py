"""The fast tier's rules: where a rank's local checkpoints go, who keeps a copy, which step a
resume takes across tiers, what is kept, and whether a node has room. Pure: no I/O.

A node-local root (tmpfs or NVMe) holds ``rank_RRRRR/step_NNNNNNNN/`` directories: each is one
rank's whole state at one step, a single-process DCP checkpoint of that rank's shards (readable
by torch's own tools) with the rank's JSON state and a manifest of hashes. A node holds the
directories of its own ranks and the copies it keeps for ranks of other nodes (``peers``): the
same layout, so a copy is used exactly as the original.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from ckpt_tool.core import layout

RANK_DIGITS = 5
SPACE_MARGIN = 1.25  # room asked for beyond the bytes a save writes (the DCP metadata, file system overhead)


def rank_dir_name(rank: int) -> str:
    """``rank_RRRRR``: the directory of one rank's local checkpoints under the node-local root."""
    return f"rank_{rank:0{RANK_DIGITS}d}"


def parse_rank_dir_name(name: str) -> int | None:
    """The rank of a ``rank_RRRRR`` directory name (exactly ``RANK_DIGITS`` digits); None for anything else."""
    digits = name.removeprefix("rank_")
    return int(digits) if digits != name and len(digits) == RANK_DIGITS and digits.isdigit() else None


def step_path(root: PurePath, rank: int, step: int) -> PurePath:
    """``root/rank_RRRRR/step_NNNNNNNN``: where ``rank``'s local checkpoint of ``step`` lives."""
    return root / rank_dir_name(rank) / layout.step_dir_name(step)


def default_root(env: Mapping[str, str], user: str, ckpt_dir: str) -> str:
    """``/dev/shm/ckpt-USER-JOB`` under SLURM (the job's tmpfs, gone with the node), else a
    directory named after the checkpoint directory (one run's local tier, not another's)."""
    job = env.get("SLURM_JOB_ID")
    key = job if job else hashlib.sha256(ckpt_dir.encode()).hexdigest()[:12]
    return f"/dev/shm/ckpt-{user}-{key}"


def peers(nodes: Sequence[str], replicas: int) -> tuple[tuple[int, ...], ...]:
    """For each rank, the ranks that keep a copy of its local checkpoints: the rank with the same
    position on each of the next ``replicas`` nodes (in the order nodes first appear), so losing
    any ``replicas`` nodes leaves a full copy. Fewer nodes than ``replicas + 1``: as many copies as
    there are other nodes; one node: none. A node with fewer ranks wraps the position around."""
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        if node not in members:
            order.append(node)
            members[node] = []
        members[node].append(rank)
    result = []
    for rank, node in enumerate(nodes):
        i, position = order.index(node), members[node].index(rank)
        chosen = []
        for k in range(1, min(replicas, len(order) - 1) + 1):
            other = members[order[(i + k) % len(order)]]
            chosen.append(other[position % len(other)])
        result.append(tuple(chosen))
    return tuple(result)


def sources(peer_map: Sequence[Sequence[int]], rank: int) -> tuple[int, ...]:
    """The ranks whose copies ``rank`` keeps."""
    return tuple(r for r, kept_by in enumerate(peer_map) if rank in kept_by)


@dataclass(frozen=True)
class LocalChoice:
    """The step a resume takes from the local tier, and for each rank the rank that holds its
    files (itself, a rank on its node, or a peer on another node that sends them)."""

    step: int
    holders: tuple[int, ...]

    def fetches(self, nodes: Sequence[str]) -> tuple[tuple[int, int], ...]:
        """(holder, rank) pairs: the copies to send over before the load (holder on another node)."""
        return tuple((h, r) for r, h in enumerate(self.holders) if nodes[h] != nodes[r])


def choose(held: Sequence[Sequence[tuple[int, int]]], nodes: Sequence[str], newer_than: int | None) -> LocalChoice | None:
    """The newest step newer than ``newer_than`` (the shared tier's newest) for which every rank's
    files are held, hash-valid, by some rank: ``held[h]`` lists the (rank, step) copies rank ``h``
    checked; ``nodes[h]`` is rank h's node. A copy on the rank's own node is preferred (no
    transfer), else the lowest rank holding one."""
    where: dict[tuple[int, int], list[int]] = {}
    for holder, copies in enumerate(held):
        for rank, step in copies:
            where.setdefault((rank, step), []).append(holder)
    steps = sorted({step for _, step in where if newer_than is None or step > newer_than}, reverse=True)
    for step in steps:
        holders = []
        for rank in range(len(nodes)):
            found = where.get((rank, step))
            if not found:
                break
            local = [h for h in found if nodes[h] == nodes[rank]]
            holders.append(rank if rank in found else min(local or found))
        else:
            return LocalChoice(step, tuple(holders))
    return None


def checker(rank_dir: int, me: int, nodes: Sequence[str]) -> bool:
    """Whether ``me`` checks (and cleans) the directory of ``rank_dir`` on its node: the ranks
    of a node share its directories out, so each is read once."""
    mates = [r for r, n in enumerate(nodes) if n == nodes[me]]
    return mates[rank_dir % len(mates)] == me


def steps_to_drop(steps: Sequence[int], keep: int, shared_newest: int | None) -> tuple[int, ...]:
    """Local steps to delete: all but the newest ``keep``, and any not newer than the shared
    tier's newest checkpoint (that one is as new and durable: a resume would not take them)."""
    ordered = sorted(steps, reverse=True)
    kept = {s for s in ordered[:keep] if shared_newest is None or s > shared_newest}
    return tuple(s for s in sorted(steps) if s not in kept)


def room_needed(own_bytes: Sequence[int], nodes: Sequence[str], peer_map: Sequence[Sequence[int]], node: str) -> int:
    """Bytes a node needs free for one more local save: its ranks' files and the copies it keeps
    for other nodes' ranks (the previous step is deleted only after the new one is written)."""
    on_node = [r for r, n in enumerate(nodes) if n == node]
    kept = {r for me in on_node for r in sources(peer_map, me)}
    return int(SPACE_MARGIN * sum(own_bytes[r] for r in {*on_node, *kept}))
