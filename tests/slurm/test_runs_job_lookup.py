"""`ckpt status JOBID` / `ckpt history JOBID` find the job's run through scontrol: the parsing on
recorded scontrol text (no cluster needed), and end to end on the real cluster (marked slurm)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tool.slurm.job_lookup import locate_in, show_job_field

SHOWN = """JobId=31 JobName=ckpt-train
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0
   Command=/scratch/my runs/exp 1/ckpt/run/submit-20261203-101500-123456.sbatch
   WorkDir=/home/me/project
   StdErr=/scratch/my runs/exp 1/ckpt/run/slurm-31.out
   StdOut=/scratch/my runs/exp 1/ckpt/run/slurm-31.out
"""
SCRIPT = """#!/bin/bash
#SBATCH --requeue
RESTART="${SLURM_RESTART_COUNT:-0}"
CKPT=(/venv/bin/python -m ckpt_tool.cli.main)
export CKPT_DIR='/scratch/my runs/exp 1/ckpt'  # the training command may read it (the reference recipe does)
RUN_DIR='/scratch/my runs/exp 1/ckpt/run'
MAX_REQUEUES=3
"""


def test_the_batch_script_names_the_run_and_checkpoint_directories():
    found = locate_in("31", SHOWN, SCRIPT)
    assert found is not None and found.found_in == "the batch script"
    assert found.run_dir == Path("/scratch/my runs/exp 1/ckpt/run") and found.ckpt_dir == Path("/scratch/my runs/exp 1/ckpt")


def test_without_the_script_the_command_path_of_ckpt_submit_names_the_run_directory():
    found = locate_in("31", SHOWN, None)
    assert found is not None and found.found_in == "scontrol's Command=" and found.run_dir == Path("/scratch/my runs/exp 1/ckpt/run")
    assert show_job_field(SHOWN, "Restarts") == "1" and show_job_field(SHOWN, "WorkDir") == "/home/me/project"


def test_a_job_not_submitted_by_ckpt_is_not_mistaken_for_one():
    other = SHOWN.replace("/scratch/my runs/exp 1/ckpt/run/submit-20261203-101500-123456.sbatch", "/home/me/train.sh")
    assert locate_in("31", other, "#!/bin/bash\nsrun python train.py --run-dir $RUN\n") is None
    assert locate_in("31", other, 'RUN_DIR="$SCRATCH/run"\n') is None  # not a path this process can read back


def ckpt_cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.slurm
@pytest.mark.slow
def test_status_and_history_of_a_job_id_show_what_the_checkpoint_directory_shows(slurm, tmp_path, cancel_jobs):
    from .test_submit_chain import Job

    job = Job(tmp_path / "job", steps=400)
    cancel_jobs.append(job)
    job.wait_for_step(8)
    job.usr1()  # checkpoint, requeue once
    job.release_when_pending()
    job.wait_for(lambda: "restart=1" in job.output() and "ready: trap installed" in job.output(), "the second start")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    by_id = ckpt_cli("status", job.id, "--json", cwd=elsewhere)
    assert by_id.returncode == 0, by_id.stderr
    got, want = json.loads(by_id.stdout), json.loads(ckpt_cli("status", job.ckpt, "--json", cwd=elsewhere).stdout)
    assert got["slurm_restarts"] == 1 and got["starts"] == 2 and got["requeues"] == 1, got
    assert got["newest_checkpoint"] is not None and got["newest_checkpoint"] >= 8
    for key in ("job_id", "starts", "requeues", "newest_checkpoint", "run_dir"):
        assert got[key] == want[key], key
    assert got["found"] == f"job {job.id}'s run directory {job.run_dir} (from the batch script)"
    text = ckpt_cli("status", job.id, cwd=elsewhere).stdout
    assert f"job {job.id}" in text and "starts 2  requeues 1" in text and "newest checkpoint: step" in text
    history = ckpt_cli("history", job.id, "--event", "requeue", "--event", "job_start", cwd=elsewhere)
    assert history.returncode == 0, history.stderr
    assert history.stdout.count("\tjob_start\t") == 2 and history.stdout.count("\trequeue\t") == 1
    assert f"job {job.id}'s run directory {job.run_dir}" in history.stderr
    subprocess.run(["scancel", job.id], check=True)


@pytest.mark.slurm
def test_a_job_id_slurm_does_not_know_names_the_checkpoint_directory_fallback(slurm, tmp_path):
    for command in ("status", "history"):
        proc = ckpt_cli(command, "99999999", cwd=tmp_path)
        err = " ".join(proc.stderr.split())
        assert proc.returncode == 3 and "SLURM knows no job 99999999" in err and "ckpt status CKPT_DIR" in err, err
        assert "or a job id" not in err


@pytest.mark.slurm
def test_a_job_not_submitted_by_ckpt_says_so(slurm, tmp_path, cancel_jobs):
    script = tmp_path / "plain.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/o-%j.out\nsleep 60\n")
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True).stdout.strip()

    class Cancel:
        id = job_id

    cancel_jobs.append(Cancel)
    proc = ckpt_cli("status", job_id, cwd=tmp_path)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 3 and f"job {job_id} was not submitted by `ckpt submit`: {script} sets no RUN_DIR" in err
    assert "ckpt status CKPT_DIR" in err
