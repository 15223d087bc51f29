"""``ckpt submit --notify CMD`` on the real cluster: the command (quotes, ``$`` and a pipe, carried
through the batch script) is run once per event of the job by its chain, with the event's JSON on
stdin: a job that finishes tells its end; a job cancelled with ``scancel`` tells the cancellation at
once, then its stop after the checkpoint (when SLURM's SIGKILL after KillWait, 5 s here, leaves the
chain the time to record it). Both jobs run side by side (~20 s)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from .test_submit_chain import Job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def notify_command(root: Path) -> str:
    """JSON lines to ``told.jsonl`` through a pipe, and "EVENT: MESSAGE" from the variables the command gets."""
    return f"cat | tee -a '{root / 'told.jsonl'}' >/dev/null; echo \"$CKPT_NOTIFY_EVENT: $CKPT_NOTIFY_MESSAGE\" >> '{root / 'words.txt'}'"


def told(root: Path) -> list[dict]:
    path = root / "told.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_finished_and_a_cancelled_job_tell_their_events_once_each(slurm, tmp_path, cancel_jobs):
    done_root, cancel_root = tmp_path / "done", tmp_path / "cancel"
    done_root.mkdir()
    cancel_root.mkdir()
    done = Job(done_root, submit_opts=("--notify", notify_command(done_root)), steps=6)
    cancelled = Job(cancel_root, submit_opts=("--notify", notify_command(cancel_root)), steps=400)
    cancel_jobs += [done, cancelled]

    cancelled.wait_for_step(3)
    cancelled.wait_for(lambda: "starting ckpt run" in cancelled.output(), "the round's start")
    assert subprocess.run(["scancel", cancelled.id]).returncode == 0
    cancelled.wait_for(lambda: [t["event"] for t in told(cancel_root)][:1] == ["cancelled"], "the cancellation told", 30)
    done.wait_done(timeout=120)
    cancelled.wait_done(timeout=60)
    time.sleep(1)  # nothing told after the job's end

    (end,) = told(done_root)
    assert (end["event"], end["job_id"], end["ckpt_dir"], end["restart"]) == ("job_finished", done.id, str(done.ckpt), 0)
    assert end["message"] == f"job {done.id} finished: the training ended ({done.ckpt})" and end["next"] == f"ckpt status {done.ckpt}"
    assert len(end["nodes"]) == 1 and end["host"]
    assert (done_root / "words.txt").read_text() == f"job_finished: {end['message']}\n"

    # told at once, while the stop's checkpoint is written: KillWait's SIGKILL may end the chain before job_stopped
    first, *rest = told(cancel_root)
    assert (first["event"], first["job_id"], first["cause"]) == ("cancelled", cancelled.id, "scancel")
    assert first["message"] == f"job {cancelled.id} cancelled (scancel): checkpointing, then stopping; not requeued"
    recorded = [json.loads(line)["event"] for line in (cancelled.run_dir / "events.jsonl").read_text().splitlines()]
    assert [t["event"] for t in rest] in ([], ["job_stopped"]) and (rest == [] or "job_stopped" in recorded)
    assert (cancel_root / "words.txt").read_text().splitlines() == [f"{t['event']}: {t['message']}" for t in (first, *rest)]
    for job in (done, cancelled):  # the command is in the script, and it never failed
        events = [json.loads(line)["event"] for line in (job.run_dir / "events.jsonl").read_text().splitlines()]
        assert "notify_failed" not in events, job.output()[-2000:]
        assert "export CKPT_NOTIFY=" in next(job.run_dir.glob("submit-*.sbatch")).read_text()
