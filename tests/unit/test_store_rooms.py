"""The store's rooms by concept: ``store/store.py`` is the directory's writer and imports none of
the modules that use it (listing, prune, recovery); those reach it only through its public
surface, never a private name of another module."""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "ckpt_tool" / "store"
USERS = ("inventory", "prune", "recovery")


def test_the_writer_imports_none_of_the_modules_that_use_it_and_has_no_mixins():
    tree = ast.parse((STORE / "store.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {f"ckpt_tool.store.{m}" for m in USERS} & imported
    store_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CheckpointStore")
    assert store_class.bases == []  # one class in one file, composed (store.owner), not mixed in
    assert not (STORE / "inspection.py").exists() and not (STORE / "maintenance.py").exists()
    assert not (STORE / "ownership.py").exists()  # one ownership.py per package is enough: store/claim.py


def test_no_store_module_reaches_into_another_modules_privates():
    for path in sorted(STORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id == "self", f"{path.name}:{node.lineno} uses .{node.attr}"


def test_the_users_of_a_store_are_functions_of_one():
    from ckpt_tool.store import inventory, prune, recovery
    from ckpt_tool.store.store import CheckpointStore

    for fn in (inventory.listing, prune.prune, recovery.clean_up_after_crash, recovery.carry_out, recovery.view):
        assert next(iter(fn.__annotations__.values())) in ("CheckpointStore", CheckpointStore), fn.__name__
