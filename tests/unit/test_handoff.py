"""When a pre-warmed spare may take a rank over (core.handoff): pure rules."""

from __future__ import annotations

import pytest

from ckpt_tool.core.handoff import WARM_MARKER, env_conflicts, process_title, script_of, threads_to_apply

BASE = {"PATH": "/usr/bin", "HOME": "/home/u", "CKPT_HEARTBEAT_SOCKET": "/tmp/s"}


def test_the_variables_torchrun_sets_per_rank_are_no_conflict() -> None:
    rank = {
        **BASE,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json",
        "OMP_NUM_THREADS": "1",
        WARM_MARKER: "1",
    }
    assert env_conflicts(BASE, rank) == []


def test_any_other_difference_is_named_in_order() -> None:
    rank = {**BASE, "CUDA_VISIBLE_DEVICES": "3", "HOME": "/other", "RANK": "0"}
    assert env_conflicts(BASE, rank) == ["CUDA_VISIBLE_DEVICES", "HOME"]
    assert env_conflicts({**BASE, "LD_PRELOAD": "x.so"}, BASE) == ["LD_PRELOAD"]


@pytest.mark.parametrize(("value", "threads"), [("1", 1), ("8", 8), ("0", None), ("", None), ("two", None), ("-1", None)])
def test_threads_to_apply(value: str, threads: int | None) -> None:
    assert threads_to_apply({"OMP_NUM_THREADS": value}) == threads
    assert threads_to_apply({}) is None


def test_process_title_is_the_command_torchrun_would_run() -> None:
    assert process_title("/v/bin/python", ["-m", "pkg.train", "--name", "a b"]) == "/v/bin/python -u -m pkg.train --name 'a b'"


def test_script_of() -> None:
    assert script_of(["-m", "pkg.train", "--x", "1"]) == ("module", "pkg.train", ["--x", "1"])
    assert script_of(["train.py"]) == ("path", "train.py", [])
    with pytest.raises(ValueError, match="no training command"):
        script_of([])
    with pytest.raises(ValueError, match="without a module"):
        script_of(["-m"])
