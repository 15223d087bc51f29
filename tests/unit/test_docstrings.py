"""Every public definition of the package says what it is for: module-level functions and
classes without a leading underscore, and the public methods and nested classes of public
classes, have a docstring (issue #31: 306 of 694 had none)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ckpt_tool"
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def undocumented(tree: ast.Module, path: str) -> list[str]:
    """``path:line name`` of each public definition in ``tree`` without a docstring."""
    missing: list[str] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, Definition) and not node.name.startswith("_"):
                if ast.get_docstring(node) is None:
                    missing.append(f"{path}:{node.lineno} {prefix}{node.name}")
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{node.name}.")

    walk(tree.body, "")
    return missing


def test_the_scan_finds_a_public_definition_without_a_docstring() -> None:
    tree = ast.parse('def f():\n    pass\n\ndef _g():\n    pass\n\nclass C:\n    """C."""\n    def m(self):\n        pass\n')
    assert undocumented(tree, "x.py") == ["x.py:1 f", "x.py:9 C.m"]


def test_every_public_definition_of_the_package_has_a_docstring() -> None:
    missing = [m for p in sorted(PACKAGE.rglob("*.py")) for m in undocumented(ast.parse(p.read_text()), str(p.relative_to(PACKAGE.parent)))]
    assert not missing, "public definitions without a docstring (say what it returns, raises, its units):\n" + "\n".join(missing)
