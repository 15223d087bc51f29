"""Comparing a manifest with what is on disk, and with its own mesh. Pure: the store gathers sizes and hashes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_tool.core import layout
from ckpt_tool.core.layout import MANIFEST_NAME
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.core.mesh import mesh_problems


@dataclass(frozen=True)
class Problem:
    """One way a checkpoint file differs from its manifest: which file, what is wrong, and what was expected
    and found (words for the user)."""

    file: str
    what: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what} (expected {self.expected}, found {self.found})"


@dataclass(frozen=True)
class DiskEntry:
    """One name in a checkpoint directory, as listed without following links."""

    bytes: int
    regular: bool  # a regular file (not a symlink, directory, device...)


def structure_problems(files: tuple[FileEntry, ...], on_disk: Mapping[str, DiskEntry]) -> list[Problem]:
    """What a listing of the directory shows without reading data: files missing, not regular (a symlink, a
    device), of the wrong size, and files the manifest does not list (the manifest itself excepted).
    Empty when all is well."""
    problems = []
    for entry in files:
        found = on_disk.get(entry.path)
        if found is None:
            problems.append(Problem(entry.path, "missing file", f"{entry.bytes} bytes", "nothing"))
        elif not found.regular:
            problems.append(Problem(entry.path, "not a regular file (symlink or special file)", "regular file", "other"))
        elif found.bytes != entry.bytes:
            problems.append(Problem(entry.path, "size differs (truncated or replaced)", f"{entry.bytes} bytes", f"{found.bytes} bytes"))
    listed = {f.path for f in files}
    for name in sorted(on_disk):
        if name not in listed and name != MANIFEST_NAME:
            problems.append(Problem(name, "extra file not in the manifest", "absent", f"{on_disk[name].bytes} bytes"))
    return problems


def hash_problems(files: tuple[FileEntry, ...], digests: Mapping[str, str]) -> list[Problem]:
    """The files whose computed digest differs from the manifest's; a file missing from ``digests`` (not
    hashed) is not reported here."""
    return [
        Problem(entry.path, "content hash differs (damaged, or copied from another step or run)", entry.hash, digests[entry.path])
        for entry in files
        if entry.path in digests and digests[entry.path] != entry.hash
    ]


def mesh_checks(manifest: Manifest) -> list[Problem]:
    """Every rank of the recorded mesh has its state file listed; the sizes fit the recorded limits."""
    mesh = manifest.layout
    listed = {f.path for f in manifest.files}
    missing = [r for r in range(mesh.world_size) if layout.rank_state_name(r) not in listed]
    problems = []
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        what = f"mesh {mesh.describe()}: no state file listed for rank {missing[0]}{more}"
        problems.append(Problem(layout.MANIFEST_NAME, what, f"{mesh.world_size} rank files", f"{mesh.world_size - len(missing)}"))
    problems += [
        Problem(layout.MANIFEST_NAME, f"mesh {mesh.describe()} does not fit the model", "sizes that divide the limits", p)
        for p in mesh_problems(mesh)
    ]
    return problems
