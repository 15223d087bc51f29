"""`ckpt run -- -m PKG.MODULE` and `ckpt submit` find a package installed editable (setuptools'
meta-path finder, the way the project itself is installed) from any directory, as `python -m`
does; a module that is nowhere is still refused before anything starts or is queued.

A fresh venv of its own (the project's venv on its path, like a site that installs the training
package next to ckpt-tool), a tiny flat-layout package `mypkg` installed there with
`pip install -e`: the project's venv is not touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def editable_python(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("editable")
    venv, project = root / "venv", root / "project"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site_dir = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True
    ).stdout.strip()
    # addsitedir also runs the project venv's .pth files: ckpt_tool's own editable finder among them
    Path(site_dir, "project_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    (project / "mypkg").mkdir(parents=True)
    # importing the package leaves a mark: the lookup must not run it
    (project / "mypkg" / "__init__.py").write_text(
        "import os\nif os.environ.get('MYPKG_MARK'):\n    open(os.environ['MYPKG_MARK'], 'w').close()\n"
    )
    (project / "mypkg" / "train.py").write_text("print('hello from mypkg.train', flush=True)\n")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "mypkg"\nversion = "0.1"\n'
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[tool.setuptools]\npackages = ["mypkg"]\n'
    )
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "-e", str(project), "--no-build-isolation", "--no-deps"],
        check=True,
        capture_output=True,
        cwd=project,
    )
    assert list(Path(site_dir).glob("__editable___mypkg*_finder.py")), "setuptools did not install its meta-path finder"
    return python


def ckpt(python: Path, cwd: Path, *args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=180, env=env
    )


@pytest.mark.slow
def test_ckpt_run_finds_an_editable_package_from_another_directory(editable_python, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = ckpt(
        editable_python, elsewhere, "run", "--no-warm", "--no-gpu-monitor", "--run-dir", tmp_path / "run", "--", "-m", "mypkg.train"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hello from mypkg.train" in proc.stdout + proc.stderr


def test_ckpt_run_still_refuses_a_module_that_is_nowhere(editable_python, tmp_path):
    proc = ckpt(editable_python, tmp_path, "run", "--run-dir", tmp_path / "run", "--", "-m", "mypkg.trian")
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "no module 'mypkg.trian'" in err and f"run from {tmp_path}" in err and "hint:" in err, err
    assert not (tmp_path / "run").exists()


def test_warm_import_of_an_editable_package_is_accepted(editable_python, tmp_path):
    """--warm-import mypkg is found; the typo after it still refused (nothing started either way)."""
    proc = ckpt(editable_python, tmp_path, "run", "--run-dir", tmp_path / "run", "--warm-import", "mypkg", "--", "-m", "mypkg.nope")
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "--warm-import" not in err and "no module 'mypkg.nope'" in err, err


def test_ckpt_submit_finds_an_editable_package_and_refuses_a_missing_one(editable_python, tmp_path):
    mark = tmp_path / "init-ran"
    env = {**os.environ, "MYPKG_MARK": str(mark)}
    ok = ckpt(editable_python, tmp_path, "submit", "--ckpt-dir", tmp_path / "c", "--dry-run", "--", "-m", "mypkg.train", env=env)
    assert ok.returncode == 0 and "-- -m mypkg.train" in ok.stdout, ok.stderr
    assert not mark.exists()  # found without importing mypkg
    bad = ckpt(editable_python, tmp_path, "submit", "--ckpt-dir", tmp_path / "c", "--", "-m", "no.such.module")
    err = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "no module 'no'" in err and f"where the job starts: {tmp_path}" in err and not bad.stdout, err
    assert not (tmp_path / "c").exists()  # refused before sbatch: no script, no event
