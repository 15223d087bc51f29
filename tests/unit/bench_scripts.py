"""The benchmark scripts under ``bench/`` as modules, for the unit tests of their pure parts (they are
scripts, not a package: each imports its neighbours from its own directory)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(relative: str) -> ModuleType:
    """``bench/<relative>.py`` loaded as a module (its directory on ``sys.path`` for its neighbours)."""
    path = BENCH / f"{relative}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name = "bench_" + relative.replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module
