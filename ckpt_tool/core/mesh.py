"""The parallel layout of a run: named mesh dimensions with their sizes. Pure.

A mesh is a row-major grid of the ranks (what ``init_device_mesh`` builds): the last dimension
varies fastest, so rank ``r`` has the coordinates of ``r`` written in the mixed radix of the
sizes. The data-parallel size, the batch plan, the reshard plan and which old rank's state a
new rank takes are functions of it.

Every kind of dimension is one entry of ``DIMENSIONS``: whether ranks along it see different
data, and whether a checkpoint may move to another size of it. A new kind of parallelism is a
new entry there, not a rewrite. ``limits`` record what a dimension's size must divide (e.g. the
tensor-parallel size must divide the attention heads), as the training script declares them;
the planner refuses a mesh that breaks them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckpt_tool.errors import CkptError, ExitCode

MAX_SIZE = 1 << 24


@dataclass(frozen=True)
class DimensionKind:
    """What a kind of mesh dimension means to ckpt-tool: whether its ranks split the batch
    (``data_parallel``), whether a checkpoint may resume at another size of it (``resizable``), whether
    ckpt-tool's own tests exercise it (``tested``), and a few words for users (``meaning``)."""

    data_parallel: bool  # ranks along it take different samples (the batch is split over it)
    resizable: bool  # a checkpoint may continue at another size of it
    tested: bool  # exercised by ckpt-tool's own tests (torchrun, gloo, FSDP2)
    meaning: str


# In the order torchtitan lays them out, outermost first (the order a mesh built here uses).
DIMENSIONS: dict[str, DimensionKind] = {
    "pp": DimensionKind(False, False, False, "pipeline stages"),
    "dp_replicate": DimensionKind(True, True, False, "replicas of HSDP (replicate x shard)"),
    "dp_shard": DimensionKind(True, True, True, "FSDP data parallel"),
    "cp": DimensionKind(False, False, False, "context parallel"),
    "tp": DimensionKind(False, True, True, "tensor parallel"),
}
ALIASES = {"dp": "dp_shard", "fsdp": "dp_shard", "shard": "dp_shard", "ddp": "dp_replicate", "replicate": "dp_replicate"}


class UnknownDimension(ValueError):
    """A dimension name this version does not know (a newer writer, or a typo)."""


def canonical_name(name: object) -> str:
    """The known dimension name ``name`` stands for (an alias such as ``fsdp`` or ``ddp`` resolved). Raises
    ``UnknownDimension`` for a name this version does not know, ``ValueError`` for a non-string (both
    from untrusted JSON)."""
    if not isinstance(name, str):
        raise ValueError(f"a mesh dimension name must be a string, got {name!r}")
    name = ALIASES.get(name, name)
    if name not in DIMENSIONS:
        raise UnknownDimension(f"unknown mesh dimension {name[:40]!r} (known: {', '.join(DIMENSIONS)}; aliases: {', '.join(ALIASES)})")
    return name


def limits_of(must_divide: Mapping[str, Mapping[str, int]] | None) -> tuple[tuple[str, str, int], ...]:
    """``{"tp": {"attention heads": 32}}`` as limits ``(("tp", "attention heads", 32),)``."""
    return tuple((dim, what, n) for dim, named in (must_divide or {}).items() for what, n in named.items())


def _size(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIZE:
        raise ValueError(f"{what} must be an integer in [1, {MAX_SIZE}], got {value!r}")
    return value


@dataclass(frozen=True)
class Mesh:
    """Dimensions ``((name, size), ...)`` in rank order (the last varies fastest) and ``limits``
    ``((dim, what, n), ...)``: the size of ``dim`` must divide ``n`` (e.g. ``("tp", "attention
    heads", 32)``)."""

    dims: tuple[tuple[str, int], ...]
    limits: tuple[tuple[str, str, int], ...] = field(default=())

    def __post_init__(self) -> None:
        names = [canonical_name(n) for n, _ in self.dims]
        if len(set(names)) != len(names):
            raise ValueError(f"a mesh dimension appears twice: {names}")
        if not names:
            raise ValueError("a mesh needs at least one dimension")
        dims = tuple((n, _size(s, f"mesh dimension {n!r}")) for n, (_, s) in zip(names, self.dims, strict=True))
        # a dimension of size 1 changes nothing but the name: left out, so equal layouts compare equal
        object.__setattr__(self, "dims", tuple((n, s) for n, s in dims if s > 1 or n == "dp_shard") or (("dp_shard", 1),))
        limits = []
        for dim, what, n in self.limits:
            if not isinstance(what, str) or not what or len(what) > 80:
                raise ValueError(f"a mesh limit must be named by a short string, got {what!r}")
            limits.append((canonical_name(dim), what, _size(n, f"mesh limit {what!r}")))
        object.__setattr__(self, "limits", tuple(sorted(set(limits))))  # a limit given twice is one limit

    # ------------------------------------------------------------------ building
    @classmethod
    def data_parallel(cls, world_size: int) -> Mesh:
        """The 1-D FSDP mesh: what a run that names no mesh uses."""
        return cls((("dp_shard", world_size),))

    @classmethod
    def of(cls, dims: Mapping[str, int] | Sequence[tuple[str, int]], must_divide: Mapping[str, Mapping[str, int]] | None = None) -> Mesh:
        """From ``{"dp_shard": 2, "tp": 2}`` (a mapping is laid out in ``DIMENSIONS`` order) or a
        sequence of pairs in rank order; ``must_divide={"tp": {"attention heads": 32}}``."""
        if isinstance(dims, Mapping):
            items = sorted(((canonical_name(n), s) for n, s in dims.items()), key=lambda d: list(DIMENSIONS).index(d[0]))
        else:
            items = [(canonical_name(n), s) for n, s in dims]
        return cls(tuple(items), limits_of(must_divide))

    def with_limits(self, limits: tuple[tuple[str, str, int], ...]) -> Mesh:
        """This mesh with more limits (``limits_of(must_divide)`` turns a mapping into them)."""
        return Mesh(self.dims, self.limits + limits)

    def with_sizes(self, sizes: Mapping[str, int]) -> Mesh:
        """This mesh with other sizes: its dimensions keep their order, new ones follow in ``DIMENSIONS`` order."""
        names = [n for n, _ in self.dims] + [n for n in DIMENSIONS if n in sizes and n not in self.names]
        return Mesh(tuple((n, sizes.get(n, self.size(n))) for n in names), self.limits)

    # ------------------------------------------------------------------ reading
    @property
    def names(self) -> tuple[str, ...]:
        """The dimension names, outermost first (the rank order)."""
        return tuple(n for n, _ in self.dims)

    def size(self, name: str) -> int:
        """The size of dimension ``name`` (an alias is accepted); 1 for a dimension the mesh does not have.
        Raises ``UnknownDimension`` for an unknown name."""
        return dict(self.dims).get(canonical_name(name), 1)

    @property
    def world_size(self) -> int:
        """The number of ranks: the product of the dimension sizes."""
        return math.prod(s for _, s in self.dims)

    @property
    def data_dims(self) -> tuple[tuple[str, int], ...]:
        """The dimensions whose ranks take different samples, in rank order."""
        return tuple((n, s) for n, s in self.dims if DIMENSIONS[n].data_parallel)

    @property
    def dp_size(self) -> int:
        """Ranks that take different samples: the product of the data-parallel dimensions."""
        return math.prod(s for _, s in self.data_dims)

    @property
    def model_parallel_size(self) -> int:
        """Ranks that share one data-parallel rank's samples (tp x cp x pp)."""
        return self.world_size // self.dp_size

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s position along each dimension (row-major: the last dimension varies fastest). Raises
        ``ValueError`` when ``rank`` is not in ``[0, world_size)``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a mesh of {self.world_size} ranks")
        out: dict[str, int] = {}
        for name, size in reversed(self.dims):
            rank, out[name] = divmod(rank, size)
        return {n: out[n] for n in self.names}

    def rank_at(self, coordinates: Mapping[str, int]) -> int:
        """The rank at ``coordinates`` (the inverse of ``coordinates``); a missing dimension counts as 0 and
        each coordinate is taken modulo its size."""
        rank = 0
        for name, size in self.dims:
            rank = rank * size + coordinates.get(name, 0) % size
        return rank

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of ``rank``: its position among the ranks that take different samples."""
        c = self.coordinates(rank)
        out = 0
        for name, size in self.data_dims:
            out = out * size + c[name]
        return out

    def same_data_layout(self, other: Mesh) -> bool:
        """Whether ``other`` has the same data-parallel dimensions with the same sizes, in the same order:
        then every data-parallel rank takes the same samples in both."""
        return self.data_dims == other.data_dims

    def describe(self) -> str:
        """``dp_shard 2 x tp 2``."""
        return " x ".join(f"{n} {s}" for n, s in self.dims)

    def compact(self) -> str:
        """``dp_shard=2,tp=2`` (a table cell)."""
        return ",".join(f"{n}={s}" for n, s in self.dims)

    # ------------------------------------------------------------------ JSON (untrusted on read)
    def to_json(self) -> dict[str, Any]:
        """The manifest's form: ``{"dims": [[name, size], ...], "must_divide": {dim: {what: n}}}`` (the
        divisibility limits the writer recorded)."""
        must: dict[str, dict[str, int]] = {}
        for dim, what, n in self.limits:
            must.setdefault(dim, {})[what] = n
        return {"dims": [[n, s] for n, s in self.dims], "must_divide": must}

    @classmethod
    def from_json(cls, data: object) -> Mesh:
        """Raises ``ValueError`` (``UnknownDimension`` for a name this version does not know)."""
        if not isinstance(data, dict) or not isinstance(data.get("dims"), list) or len(data["dims"]) > len(DIMENSIONS):
            raise ValueError(f"field 'mesh' must be an object with a list 'dims' of at most {len(DIMENSIONS)} pairs")
        dims = []
        for pair in data["dims"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"mesh dimension must be a [name, size] pair, got {str(pair)[:80]!r}")
            dims.append((pair[0], pair[1]))
        must = data.get("must_divide", {})
        if not isinstance(must, dict) or any(not isinstance(v, dict) or len(v) > 16 for v in must.values()):
            raise ValueError("field 'mesh.must_divide' must map dimension names to {what: number}")
        return cls(tuple(dims), limits_of(must))


def source_rank(old: Mesh, new: Mesh, rank: int) -> int:
    """The old rank whose per-rank state (RNG streams, a per-rank data position) new rank ``rank``
    takes: the one at its coordinates, each taken modulo the old size. On the same mesh: itself.
    Ranks that share a data-parallel coordinate keep sharing one (tensor-parallel peers draw the
    same dropout masks on replicated activations)."""
    return old.rank_at(new.coordinates(rank))


def _broken(mesh: Mesh) -> list[tuple[str, str, int]]:
    return [(dim, what, n) for dim, what, n in mesh.limits if n % mesh.size(dim)]


def mesh_problems(mesh: Mesh) -> list[str]:
    """The recorded limits ``mesh`` breaks (empty: it fits the model)."""
    return [f"{dim} {mesh.size(dim)} does not divide the {what} ({n})" for dim, what, n in _broken(mesh)]


def require_fit(mesh: Mesh, exit_code: int = ExitCode.USAGE) -> None:
    """Raise when ``mesh`` breaks a limit it records, naming the nearest sizes that fit.

    Raises:
        CkptError: with ``exit_code`` (2 for a run's own configuration, 4 for a checkpoint that
            cannot continue on it).
    """
    problems = mesh_problems(mesh)
    if not problems:
        return
    dims = dict.fromkeys(d for d, _, _ in _broken(mesh))
    fits = "; ".join(f"{d} sizes that fit: {' or '.join(map(str, nearest(sizes_that_fit(mesh, d), mesh.size(d))))}" for d in dims)
    raise CkptError(
        f"mesh {mesh.describe()} does not fit the model: {'; '.join(problems)}",
        f"{fits} (the world size must stay a multiple of the model-parallel sizes)",
        exit_code,
    )


def sizes_that_fit(mesh: Mesh, dim: str) -> list[int]:
    """Sizes of ``dim`` that divide every limit recorded for it."""
    limits = [n for d, _, n in mesh.limits if d == dim]
    bound = math.gcd(*limits) if limits else MAX_SIZE
    return [s for s in range(1, min(bound, 4096) + 1) if bound % s == 0]


def nearest(values: Sequence[int], target: int) -> list[int]:
    """The value just below ``target`` and the one just above, among ``values`` (at most two)."""
    below = [v for v in values if v < target]
    above = [v for v in values if v > target]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def mesh_for(world_size: int, saved: Mesh, sizes: Mapping[str, int] | None = None) -> Mesh:
    """The mesh a run of ``world_size`` ranks continues ``saved`` on: the model-parallel sizes of
    ``saved`` unless ``sizes`` changes them (e.g. ``{"tp": 1}``), the data-parallel size what is
    left (FSDP's ``dp_shard`` takes the change; ``dp_replicate`` stays).

    Raises:
        CkptError: the sizes do not multiply to ``world_size`` (exit 2), with the nearest that do.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise CkptError(f"world size must be a positive integer, got {world_size!r}", "e.g. --world-size 48", ExitCode.USAGE)
    wanted = {canonical_name(n): _size(s, f"--{n}") for n, s in (sizes or {}).items()}
    fixed = {n: wanted.get(n, s) for n, s in saved.dims if n != "dp_shard"} | {n: s for n, s in wanted.items() if n != "dp_shard"}
    per_shard = math.prod(fixed.values())
    if world_size % per_shard:
        fits = [k * per_shard for k in range(1, world_size // per_shard + 2)]
        parts = " x ".join(f"{n} {s}" for n, s in fixed.items())
        raise CkptError(
            f"{world_size} ranks cannot be laid out as {parts} x dp_shard: {world_size} is not a multiple of {per_shard}",
            f"use a world size that is a multiple of {per_shard} (nearest: {' or '.join(map(str, nearest(fits, world_size)))}), "
            f"or other model-parallel sizes",
            ExitCode.USAGE,
        )
    return saved.with_sizes({**fixed, "dp_shard": world_size // per_shard})
