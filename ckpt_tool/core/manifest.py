"""The checkpoint manifest: a frozen dataclass with a strict JSON round-trip.

The manifest is written last into a checkpoint; its presence marks the checkpoint committed.
It binds every file to its run and step (the per-file hash is seeded with both), and records
what the trajectory depends on, so a resume can say when it will no longer be bit-identical.
Parsing treats the file as untrusted: wrong types, unknown versions, absurd sizes and paths that
could leave the checkpoint directory are refused with a precise message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.layout import DCP_METADATA_NAME, MANIFEST_NAME
from ckpt_tool.core.mesh import Mesh, UnknownDimension
from ckpt_tool.errors import CkptError, DamageError, ExitCode, NewerFormatError

FORMAT_VERSION = 1
HASH_ALGO = "xxh3_128"
MAX_FILE_BYTES = 1 << 50  # 1 PiB: anything larger is a damaged or hostile manifest
MAX_FILES = 1_000_000
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}$")


def check_file_name(name: object) -> str:
    """A manifest path must be one plain file name inside the checkpoint directory."""
    if name == DCP_METADATA_NAME:
        return name
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or name == MANIFEST_NAME:
        raise ValueError(
            f"unsafe or invalid file name in manifest: {str(name)[:80]!r} (only plain names inside the checkpoint directory are allowed)"
        )
    return name


ADOPTED = "adopted"  # the lineage event of weights adopted from outside (`ckpt adopt`)


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its plain name inside the step directory (``check_file_name``), its size in
    bytes, its ``HASH_ALGO`` hex digest (seeded with the run and the step) and the rank that wrote it."""

    path: str
    bytes: int
    hash: str
    rank: int


@dataclass(frozen=True)
class Probe:
    """Values recorded at save time on the fixed probe batch; verification recomputes them."""

    loss: float
    grad_norm: float
    lr: float
    step: int


@dataclass(frozen=True)
class Manifest:
    """What a committed checkpoint holds: its run and step, when it was committed (epoch seconds), the world
    size and every file, and what the trajectory depends on: the batch split, the mesh, the environment
    (``env``: torch version and the like), the probe, the entry point that builds the model (with its
    JSON arguments) and the lineage (adoptions, reshards). Frozen; ``to_json``/``from_json`` round-trip
    it."""

    run_id: str
    step: int
    created_at: float
    world_size: int
    files: tuple[FileEntry, ...]
    batch: BatchConfig | None = None
    mesh: Mesh | None = None  # None: written before meshes were recorded (a 1-D FSDP mesh)
    env: Mapping[str, Any] = field(default_factory=dict)
    probe: Probe | None = None
    entry_point: str | None = None
    entry_kwargs: Mapping[str, Any] = field(default_factory=dict)  # JSON arguments for the entry point
    lineage: tuple[Mapping[str, Any], ...] = ()
    format_version: int = FORMAT_VERSION
    hash_algo: str = HASH_ALGO

    @property
    def total_bytes(self) -> int:
        """The checkpoint's size: the sum of its files' bytes (the manifest itself not counted)."""
        return sum(f.bytes for f in self.files)

    @property
    def layout(self) -> Mesh:
        """The mesh that wrote this checkpoint (a 1-D FSDP mesh when none is recorded)."""
        return self.mesh if self.mesh is not None else Mesh.data_parallel(self.world_size)

    @property
    def adopted(self) -> bool:
        """Weights adopted from outside (``ckpt adopt``): a model only, loaded as initial weights."""
        return any(entry.get("event") == ADOPTED for entry in self.lineage)

    def to_json(self) -> str:
        """The manifest file's text: indented JSON with sorted keys and a final newline (the batch with its
        global batch spelled out, for readers)."""
        data = asdict(self)
        data["mesh"] = None if self.mesh is None else self.mesh.to_json()
        data["env"] = dict(self.env)
        data["entry_kwargs"] = dict(self.entry_kwargs)
        data["lineage"] = [dict(x) for x in self.lineage]
        if self.batch is not None:
            data["batch"]["global_batch"] = self.batch.global_batch
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str | bytes, where: str = "manifest") -> Manifest:
        """Parse a manifest file's text, treated as untrusted (``where`` names it in messages). Raises
        ``NewerFormatError`` for a newer format version or an unknown mesh dimension, ``CkptError``
        (FAILED, "damaged") for anything else wrong."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _bad(where, f"is not valid JSON ({exc})") from None
        try:
            return _parse(data)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, _VersionError):
                raise NewerFormatError(
                    f"{where} has format version {exc.args[0]}, this ckpt-tool reads version {FORMAT_VERSION}",
                    "upgrade ckpt-tool to read checkpoints written by a newer version",
                ) from None
            if isinstance(exc, UnknownDimension):  # not damage: a newer writer's kind of parallelism
                raise NewerFormatError(f"{where}: {exc}", "upgrade ckpt-tool to read checkpoints written by a newer version") from None
            detail = f"misses the field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise _bad(where, detail) from None


class _VersionError(ValueError):
    pass


def _bad(where: str, detail: str) -> CkptError:
    return DamageError(f"{where} {detail}", "the checkpoint is damaged: run `ckpt validate` and `ckpt rollback`", ExitCode.FAILED)


def _int(value: object, name: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"field {name!r} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _num(value: object, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"field {name!r} must be a number, got {value!r}")
    return float(value)


def _str(value: object, name: str, max_len: int = 4096) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise ValueError(f"field {name!r} must be a string of at most {max_len} characters, got {str(value)[:80]!r}")
    return value


def _dict(value: object, name: str) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"field {name!r} must be an object, got {type(value).__name__}")
    return value


def _parse(data: object) -> Manifest:
    data = _dict(data, "manifest")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"field 'format_version' must be an integer, got {version!r}")
    if version != FORMAT_VERSION:
        raise _VersionError(version)
    if data.get("hash_algo") != HASH_ALGO:
        raise ValueError(f"unknown hash algorithm {data.get('hash_algo')!r} (expected {HASH_ALGO!r})")
    raw_files = data["files"]
    if not isinstance(raw_files, list) or len(raw_files) > MAX_FILES:
        raise ValueError(f"field 'files' must be a list of at most {MAX_FILES} entries")
    world_size = _int(data["world_size"], "world_size", 1, 1 << 24)
    files = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_files):
        raw = _dict(raw, f"files[{i}]")
        entry = FileEntry(
            path=check_file_name(raw["path"]),
            bytes=_int(raw["bytes"], f"files[{i}].bytes", 0, MAX_FILE_BYTES),
            hash=_str(raw["hash"], f"files[{i}].hash", 64),
            rank=_int(raw["rank"], f"files[{i}].rank", 0, world_size - 1),
        )
        if entry.path in seen:
            raise ValueError(f"file {entry.path!r} is listed twice")
        seen.add(entry.path)
        files.append(entry)
    batch = None
    if data.get("batch") is not None:
        b = _dict(data["batch"], "batch")
        batch = BatchConfig(
            _int(b["micro_batch"], "batch.micro_batch", 1),
            _int(b["grad_accum"], "batch.grad_accum", 1),
            _int(b["dp_size"], "batch.dp_size", 1),
        )
    probe = None
    if data.get("probe") is not None:
        p = _dict(data["probe"], "probe")
        probe = Probe(
            _num(p["loss"], "probe.loss"), _num(p["grad_norm"], "probe.grad_norm"), _num(p["lr"], "probe.lr"), _int(p["step"], "probe.step")
        )
    lineage = data.get("lineage", [])
    if not isinstance(lineage, list):
        raise TypeError("field 'lineage' must be a list")
    entry_point = data.get("entry_point")
    mesh = _mesh(data, world_size)
    return Manifest(
        run_id=_str(data["run_id"], "run_id", 128),
        step=_int(data["step"], "step"),
        created_at=_num(data["created_at"], "created_at"),
        world_size=world_size,
        files=tuple(files),
        batch=batch,
        mesh=mesh,
        env=_dict(data.get("env", {}), "env"),
        probe=probe,
        entry_point=None if entry_point is None else _str(entry_point, "entry_point", 512),
        entry_kwargs=_dict(data.get("entry_kwargs", {}), "entry_kwargs"),
        lineage=tuple(_dict(x, "lineage[]") for x in lineage),
    )


def _mesh(data: dict, world_size: int) -> Mesh | None:
    """The recorded mesh; manifests of versions before meshes have ``parallelism`` (a mapping) or nothing."""
    if data.get("mesh") is not None:
        mesh = Mesh.from_json(data["mesh"])
    elif data.get("parallelism"):
        parallelism = _dict(data["parallelism"], "parallelism")
        mesh = Mesh.of({k: _int(v, f"parallelism.{k}", 1, 1 << 24) for k, v in parallelism.items()})
    else:
        return None
    if mesh.world_size != world_size:
        raise ValueError(f"mesh {mesh.describe()} has {mesh.world_size} ranks, but world_size is {world_size}")
    return mesh
