"""The layering README's Architecture section promises: imports point down only, and the
pure core and the store never import torch (so `ckpt list` and friends stay fast)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ckpt_tool"

# lower number = lower layer; a module may import from its own layer or below
LAYERS = {
    "errors": 0,
    "timing": 0,  # the timing hook: standard library only, used by every layer
    "core": 1,
    "config": 1,  # ckpt.toml defaults
    "store": 2,
    "supervise": 3,
    "training": 4,
    "slurm": 4,
    "ops": 5,
    "entrypoints": 6,
    "recipes": 6,
    "cli": 7,
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "ckpt_tool" or len(parts) < 2:
        return None
    return parts[1]


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        if layer_of(name) in LAYERS:
            out.append((name, path))
    return out


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"give these a layer: {sorted(packages - set(LAYERS))}"


def test_imports_point_down_only():
    upward = []
    for name, path in modules():
        mine = LAYERS[layer_of(name)]
        for imported in imports(path):
            layer = layer_of(imported)
            if layer in LAYERS and LAYERS[layer] > mine:
                upward.append(f"{name} imports {imported}")
    assert not upward, "\n".join(upward)


def test_core_and_store_do_not_import_torch():
    heavy = [
        f"{name} imports {i}"
        for name, path in modules()
        if layer_of(name) in ("core", "store", "errors", "config")
        for i in imports(path)
        if i.split(".")[0] == "torch"
    ]
    assert not heavy, "\n".join(heavy)
