"""Fixtures of the integration tests: `supervised` (the reference recipe under `ckpt run`, 2 ranks,
cleaned up after) and `ckpt` (a copy of the recipe's checkpoints, steps 5..20, to change)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from ckpt_tool.recipes.launch import RecipeJob, compare_runs, read_metrics

from ..conftest import SAVE_EVERY, STEPS


def ckpt_cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """`ckpt ARGS` in a process of its own, as a user runs it: exit code and output."""
    return subprocess.run([sys.executable, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def ckpt_json(*args: object, timeout: float = 300) -> Any:
    """`ckpt ARGS` (with --json among them) that must succeed: its JSON."""
    proc = ckpt_cli(*args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def ckpt(recipe_checkpoints, tmp_path) -> Path:
    dest = tmp_path / "ckpt"
    shutil.copytree(recipe_checkpoints, dest)
    return dest


class Supervised(RecipeJob):
    """`ckpt run --nproc-per-node 2 -- -m ckpt_tool.recipes.tiny_gpt ...` in ``root``."""

    def __init__(self, root: Path, *extra: str, run_opts: tuple[str, ...] = (), steps: int = STEPS, save_every: int = SAVE_EVERY) -> None:
        super().__init__(root, steps, save_every, extra, run_opts=run_opts)

    def rank_list(self) -> list[psutil.Process]:
        return [p for _, p in sorted(self.ranks().items())]


@pytest.fixture
def supervised(tmp_path):
    made: list[Supervised] = []

    def make(*extra: str, run_opts: tuple[str, ...] = (), steps: int = STEPS, name: str = "", save_every: int = SAVE_EVERY) -> Supervised:
        s = Supervised(tmp_path / name if name else tmp_path, *extra, run_opts=run_opts, steps=steps, save_every=save_every)
        s.root.mkdir(exist_ok=True)
        made.append(s)
        return s

    yield make
    for s in made:
        s.kill()
    # No test leaves a process behind: nothing still runs with this test's directory in its command line.
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    for p in leftovers:
        p.kill()
    assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"


def assert_identical_to_reference(reference_run, s: Supervised) -> None:
    comparison = compare_runs(reference_run.metrics_lines(), read_metrics(s.metrics))
    assert comparison.identical, comparison.mismatches[:3]
    assert comparison.steps_compared == STEPS


def assert_no_straggler(s: Supervised) -> None:
    """A normal run (restarts, checkpoints, a data stall) names no straggler and no idle GPU (a
    run shorter than 5 s of steps after its warm-up is not scored for stragglers at all)."""
    false_alarms = [e for e in s.events() if e["event"] in ("straggler", "gpu_idle", "gpu_error")]
    assert not false_alarms, false_alarms


def newest_per_step(lines: list) -> list:
    """A metrics record's newest line of each step (a step a replay or a restart ran again is
    the trajectory the run went on from), in step order."""
    newest = {}
    for m in lines:
        newest[m.step if hasattr(m, "step") else m["step"]] = m
    return [newest[k] for k in sorted(newest)]


def edit_one_value(ckpt_dir: Path, step: int, key: str, factor: float = 2.0) -> tuple[float, float]:
    """The first element of ``key``'s first shard times ``factor`` (2: its exponent's lowest bit
    flipped; a one-ulp change of an Adam moment is lost in the update's rounding), in place in its DCP file, and
    that file's hash in the manifest made to match: a checkpoint edited by hand, which still loads
    (the hashes agree). Returns (old, new) value. DCP stores a tensor item as a torch.save zip
    whose data is not compressed: the element is found by its bytes."""
    import dataclasses
    import io

    import torch

    from ckpt_tool.core.layout import MANIFEST_NAME
    from ckpt_tool.store.checksums import binding_seed, hash_file
    from ckpt_tool.store.durable import atomic_write
    from ckpt_tool.store.store import CheckpointStore
    from ckpt_tool.training.safe_dcp import load_metadata_safely

    store = CheckpointStore(ckpt_dir)
    directory = store.step_path(step)
    with open(directory / ".metadata", "rb") as f:
        metadata = load_metadata_safely(f)
    info = next(info for index, info in metadata.storage_data.items() if index.fqn == key)
    path = directory / info.relative_path
    raw = bytearray(path.read_bytes())
    item = bytes(raw[info.offset : info.offset + info.length])
    tensor = torch.load(io.BytesIO(item), weights_only=True).contiguous().view(-1)
    at = info.offset + item.find(tensor[:16].numpy().tobytes())
    old = float(tensor[0])
    new = tensor[:1] * factor
    raw[at : at + 4] = new.numpy().tobytes()
    path.write_bytes(bytes(raw))
    manifest = store.read_manifest(step)
    digest = hash_file(path, binding_seed(manifest.run_id, step, path.name))
    files = tuple(dataclasses.replace(f, hash=digest.hash) if f.path == path.name else f for f in manifest.files)
    atomic_write(directory / MANIFEST_NAME, dataclasses.replace(manifest, files=files).to_json().encode())
    assert store.check_files(step).ok
    return old, float(new[0])
