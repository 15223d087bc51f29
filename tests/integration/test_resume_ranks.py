"""Resume decisions that depend on what the other ranks saw, tested in one process: the comm is
a fake whose other rank answers as scripted (the collaborators are passed in, no torchrun)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ckpt_tool.core.mesh import Mesh
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.probe import current_env
from ckpt_tool.training.resume import Resumption

from .tiny import make_trainer


class PeerComm:
    """This process is rank 0; ``all_gather`` adds the scripted answers of one other rank."""

    distributed, rank, world_size, group, is_coordinator = False, 0, 1, None, True

    def __init__(self, peer_answers: list[Any]) -> None:
        self.peer_answers = list(peer_answers)
        self.gathers = 0

    def broadcast(self, value: Any) -> Any:
        return value

    def on_coordinator(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def all_gather(self, value: Any) -> list[Any]:
        self.gathers += 1
        return [value, self.peer_answers.pop(0) if self.peer_answers else value]

    def barrier(self) -> None:
        pass


def saved_run(tmp_path, steps: int = 4):
    t = make_trainer(tmp_path / "c", save_every=2)
    for step in range(1, steps + 1):
        t.step()
        t.manager.maybe_save(step)
    t.manager.close()
    return CheckpointStore(tmp_path / "c")


def resumption(tmp_path, comm: PeerComm) -> Resumption:
    t = make_trainer(tmp_path / "c")
    store = CheckpointStore(tmp_path / "c")
    return Resumption(
        CheckpointConfig(tmp_path / "c"),
        t.manager.state,
        t.manager.probe_spec,
        store,
        comm,
        lambda: current_env(t.model, Mesh.data_parallel(1)),
        None,
        Mesh.data_parallel(1),
    )


def test_a_misfit_seen_by_another_rank_is_refused_everywhere_and_moves_nothing(tmp_path):
    store = saved_run(tmp_path)
    peer = ([], CkptError("3 entries the run needs are not in the checkpoint", "resume with the model that wrote it", ExitCode.CONFLICT))
    with pytest.raises(CkptError) as err:
        resumption(tmp_path, PeerComm([peer])).run()
    assert err.value.exit_code == ExitCode.CONFLICT and "entries the run needs" in err.value.message
    assert store.read_latest() == 4 and store.committed_on_disk() == [2, 4] and not store.quarantine_root.exists()


def test_damage_seen_by_another_rank_makes_every_rank_fall_back(tmp_path):
    store = saved_run(tmp_path)
    peer_damage = (["__1_0.distcp does not match the manifest"], None)
    resumed = resumption(tmp_path, PeerComm([peer_damage])).run()
    assert resumed is not None and resumed.step == 2  # step 4 quarantined for rank 1's finding
    [q] = [e for e in store.events() if e.event == "quarantine"]
    assert q.step == 4 and "__1_0.distcp does not match" in q.data["reason"]
    assert store.read_latest() == 2
