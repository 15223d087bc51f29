"""Defaults for the ``ckpt`` commands from ``ckpt.toml`` or ``[tool.ckpt]`` in ``pyproject.toml``.

Looked up in the current directory and its parents; the first file found wins. Keys are the
commands' option names with underscores (``entry_point``, ``nproc_per_node``...).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ckpt_tool.errors import CkptError, ExitCode


def find_config(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        for name, section in (("ckpt.toml", None), ("pyproject.toml", ("tool", "ckpt"))):
            path = folder / name
            if not path.is_file():
                continue
            try:
                data = tomllib.loads(path.read_text())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise CkptError(f"{path} is not valid TOML: {exc}", "fix the file or remove it", ExitCode.USAGE) from None
            if section is not None:
                for key in section:
                    data = data.get(key, {}) if isinstance(data, dict) else {}
                if not data:
                    continue
            if not isinstance(data, dict):
                raise CkptError(f"{path}: [tool.ckpt] must be a table", "see README, 'Configuration'", ExitCode.USAGE)
            return path, data
    return None


def default(key: str, start: Path | None = None) -> Any:
    found = find_config(start)
    return None if found is None else found[1].get(key)
