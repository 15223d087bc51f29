"""Defaults for the ``ckpt`` commands from ``ckpt.toml`` or ``[tool.ckpt]`` in ``pyproject.toml``.

Looked up in the current directory and its parents; the first file found wins. Keys are the
commands' option names with underscores; every key is checked when the file is read: an
unknown key is named with the nearest known one, a value of the wrong type says what it must be.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ckpt_tool.errors import CkptError, ExitCode

# key -> (type, an example of a valid value as TOML)
KEYS: dict[str, tuple[type, str]] = {
    "entry_point": (str, '"mypkg.train:build_for_verify"'),
    "time": (str, '"24:00:00"'),
    "partition": (str, '"gpu"'),
    "account": (str, '"ml-team"'),
    "qos": (str, '"normal"'),
    "constraint": (str, '"a100&ib"'),
    "mem": (str, '"200G"'),
    "cpus_per_task": (int, "32"),
    "spares": (int, "1"),
    "node_check": (str, '"dcgmi diag -r 1"'),
}


def check_values(path: Path, data: dict[str, Any]) -> None:
    """Refuse unknown keys and values of the wrong type, naming the file, the key and the fix."""
    for key, value in data.items():
        if key not in KEYS:
            near = difflib.get_close_matches(key, list(KEYS), n=1)
            guess = f" (did you mean {near[0]!r}?)" if near else ""
            raise CkptError(f"{path}: unknown key {key!r}{guess}", f"known keys: {', '.join(KEYS)}", ExitCode.USAGE)
        kind, example = KEYS[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            got = type(value).__name__ if not isinstance(value, (list, dict)) else ("an array" if isinstance(value, list) else "a table")
            raise CkptError(
                f"{path}: {key} must be {'a string' if kind is str else 'an integer'}, got {got} {value!r}",
                f"e.g. {key} = {example}" + (" (SLURM's D-HH:MM:SS or minutes, as a string)" if key == "time" else ""),
                ExitCode.USAGE,
            )


def find_config(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The first config file found from ``start`` (the current directory) upwards: ``ckpt.toml``, or
    ``pyproject.toml`` with a non-empty ``[tool.ckpt]``, with its checked values; None when there is
    none. Raises ``CkptError`` (USAGE) for invalid TOML, a section that is not a table, or an unknown key
    or wrong type."""
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
            check_values(path, data)
            return path, data
    return None


def default(key: str, start: Path | None = None) -> Any:
    """The config file's value for option ``key`` (underscores), or None when no file or no such key; raises
    as ``find_config``."""
    found = find_config(start)
    return None if found is None else found[1].get(key)
