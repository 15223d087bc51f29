"""The wheel users install holds every package and the sbatch templates.

A package listed by hand once went missing from the wheel (``ckpt_tool.supervise`` and
``ckpt_tool.slurm``): every ``ckpt`` command then failed with ModuleNotFoundError after a plain
``pip install .``. This builds the wheel the way pip does and compares it with the source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    # From a clean copy: setuptools reuses a build/ directory left in the checkout, which would
    # hide a package the current configuration leaves out.
    src, out = tmp_path_factory.mktemp("src") / "ckpt-tool", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    [wheel] = out.glob("ckpt_tool-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def source_packages() -> set[str]:
    found = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "ckpt_tool").rglob("__init__.py") if "__pycache__" not in p.parts}
    return found | {"ckpt_tool/slurm_templates"}


def test_every_package_of_the_source_tree_is_in_the_wheel(wheel_names):
    in_wheel = {name.rsplit("/", 1)[0] for name in wheel_names if name.endswith("/__init__.py")}
    missing = source_packages() - in_wheel
    assert not missing, f"packages left out of the wheel: {sorted(missing)}"
    assert {"ckpt_tool/supervise", "ckpt_tool/slurm"} <= in_wheel  # the two that went missing once


def test_every_module_and_the_sbatch_template_are_in_the_wheel(wheel_names):
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "ckpt_tool").rglob("*.py") if "__pycache__" not in p.parts}
    assert not modules - wheel_names
    assert "ckpt_tool/slurm_templates/train.sbatch.tmpl" in wheel_names
    assert any(n.endswith("entry_points.txt") for n in wheel_names)
