"""Fixtures of the SLURM tests: a cluster that answers (or a skip, never under CI=true), and
jobs cancelled at the end of a test whatever happened."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _cluster_answers() -> bool:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0


@pytest.fixture(scope="module")
def slurm() -> None:
    if not _cluster_answers():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no SLURM cluster answers: .ci/slurm-up should have started one")
        pytest.skip("no SLURM cluster here (sbatch/sinfo missing or not answering); `make test` starts one when run as root with apt")


@pytest.fixture
def cancel_jobs():
    jobs: list = []
    yield jobs
    for job in jobs:
        subprocess.run(["scancel", job.id], capture_output=True)
