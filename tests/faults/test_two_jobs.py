"""Two jobs pointed at one checkpoint directory: the second is refused with who holds it."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from ckpt_tool.core import layout
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.recipes.launch import FAST_ARGS, recipe_args, run, torchrun_command
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.supervise.processes import kill_tree

from ..integration.tiny import make_trainer

pytestmark = [pytest.mark.faults, pytest.mark.filterwarnings("ignore::UserWarning")]


def write_owner(ckpt, **fields):
    ckpt.mkdir(parents=True, exist_ok=True)
    now = time.time()
    owner = {"job_id": None, "host": socket.gethostname(), "pid": 1, "since": now - 50, "last_seen": now, **fields}
    (ckpt / layout.OWNER_NAME).write_text(json.dumps(owner))


def test_a_live_owner_on_this_host_is_refused_then_taken_over_once_dead(tmp_path):
    other = subprocess.Popen(["sleep", "60"])
    try:
        write_owner(tmp_path / "c", pid=other.pid)
        t = make_trainer(tmp_path / "c")
        with pytest.raises(CkptError) as err:
            t.manager.resume()
        assert err.value.exit_code == ExitCode.CONFLICT
        assert f"pid {other.pid}" in err.value.message and socket.gethostname() in err.value.message
        assert "take over" in err.value.hint
    finally:
        other.kill()
        other.wait()
    t2 = make_trainer(tmp_path / "c")
    assert t2.manager.resume() is None  # the owner is gone: taken over
    t2.manager.close()
    [event] = [e for e in CheckpointStore(tmp_path / "c").events() if e.event == "owner"]
    assert "gone" in event.data["reason"]


def test_an_owner_on_another_host(tmp_path):
    write_owner(tmp_path / "c", host="elsewhere", pid=4242, job_id="777")
    with pytest.raises(CkptError, match="job 777 on elsewhere"):
        make_trainer(tmp_path / "c").manager.resume()
    t = make_trainer(tmp_path / "c", take_over=True)
    assert t.manager.resume() is None
    t.manager.close()
    write_owner(tmp_path / "d", host="elsewhere", pid=4242, last_seen=time.time() - 3600)
    t = make_trainer(tmp_path / "d")
    assert t.manager.resume() is None  # not seen for an hour: stale
    t.manager.close()


@pytest.mark.slow  # two real torchrun jobs
def test_a_second_real_job_is_refused_while_the_first_runs(tmp_path):
    ckpt = tmp_path / "ckpt"
    # job A is slowed down (a 1 s commit per save) so it surely still runs when B starts
    a = subprocess.Popen(
        torchrun_command(2, recipe_args(ckpt, tmp_path / "a.jsonl", 60, 5, *FAST_ARGS, "--save-delay", "1")),
        stdout=open(tmp_path / "a.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (ckpt / "LATEST").exists():
            assert a.poll() is None and time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-2000:]
            time.sleep(0.1)
        code = run(torchrun_command(2, recipe_args(ckpt, tmp_path / "b.jsonl", 60, 5, *FAST_ARGS)), tmp_path / "b.log", timeout=120)
        log = (tmp_path / "b.log").read_text()
        assert a.poll() is None, "job A ended before B was tried: the test proves nothing"
        assert code != 0 and "is being written by a job outside SLURM on" in log
        assert a.wait(timeout=180) == 0  # the first job was not disturbed
    finally:
        kill_tree([a.pid])
    assert not (tmp_path / "b.jsonl").exists() or not (tmp_path / "b.jsonl").read_text()
    assert CheckpointStore(ckpt).read_latest() == 60


def test_a_job_whose_directory_was_taken_over_can_no_longer_commit(tmp_path):
    a = make_trainer(tmp_path / "c", save_every=2)
    assert a.manager.resume() is None
    a.step()
    a.manager.save(1)
    b = make_trainer(tmp_path / "c", save_every=2, take_over=True)  # told to take over a live job
    assert b.manager.resume() == 1
    a.step()
    with pytest.raises(CkptError) as err:  # on_save_error="stop": the commit is refused, loudly
        a.manager.save(2)
    assert err.value.exit_code == ExitCode.CONFLICT and "was taken over by" in err.value.message
    store = CheckpointStore(tmp_path / "c")
    assert store.read_latest() == 1 and store.committed_on_disk() == [1]
    b.step()
    b.manager.save(2)  # the new owner writes on
    assert store.read_latest() == 2
    a.manager.close()
    b.manager.close()


def test_the_claim_is_kept_alive_while_the_loop_does_not_call_the_manager(tmp_path, monkeypatch):
    # A long evaluation without maybe_save() must not make the job look dead to a second job.
    import ckpt_tool.training.directory_claim as ownership_module

    monkeypatch.setattr(ownership_module, "OWNER_REFRESH_S", 0.2)
    t = make_trainer(tmp_path / "c")
    t.manager.resume()
    path = tmp_path / "c" / layout.OWNER_NAME
    first = json.loads(path.read_text())["last_seen"]
    time.sleep(1.0)  # no call into the manager meanwhile
    assert json.loads(path.read_text())["last_seen"] > first
    t.manager.close()
    time.sleep(0.5)
    closed = json.loads(path.read_text())["last_seen"]
    time.sleep(0.6)
    assert json.loads(path.read_text())["last_seen"] == closed  # close() ends the refreshing
