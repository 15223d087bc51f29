"""A failed save's message and what the training does next (pure: training.save_failures)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from ckpt_tool.errors import RESTART_CANNOT_HELP, CkptError, ExitCode
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.save_failures import FailedSavePolicy, Needed, SaveFailure, describe, human_bytes


def enospc(**kw) -> SaveFailure:
    facts = {
        "step": 15,
        "root": Path("/scratch/ckpt"),
        "error_type": "OSError",
        "error_text": "No space left on device",
        "errno": errno.ENOSPC,
        "free": 921_600,
        "needed": Needed(2_182_750, "the size of step 10"),
        "latest": 10,
    }
    return SaveFailure(**{**facts, **kw})


def test_a_full_disk_names_enospc_the_directory_the_bytes_needed_and_free_and_what_to_do():
    e = describe(enospc())
    assert e.message == (
        "saving step 15 failed: no space left on device (ENOSPC) in /scratch/ckpt: "
        "921.6 kB free; this save needed about 2.2 MB (the size of step 10)"
    )
    assert "`ckpt prune /scratch/ckpt --keep-last 1`" in e.hint and "`ckpt du /scratch/ckpt`" in e.hint
    assert "the previous checkpoint (step 10) is intact, LATEST still names it" in e.hint
    assert e.exit_code == ExitCode.SAVE_FAILED == 78
    assert "no checkpoint was committed yet" in describe(enospc(latest=None, needed=None)).hint


def test_other_os_errors_are_named_with_their_errno_and_file():
    e = describe(
        enospc(error_type="PermissionError", error_text="Permission denied", errno=errno.EACCES, filename="/scratch/ckpt/.step_15.partial")
    )
    assert (
        e.message == "saving step 15 to /scratch/ckpt failed: PermissionError [EACCES]: Permission denied (/scratch/ckpt/.step_15.partial)"
    )
    assert "writable by this user" in e.hint and "step 10" in e.hint and e.exit_code == ExitCode.SAVE_FAILED
    no_os = describe(enospc(error_type="RuntimeError", error_text="boom", errno=None))
    assert no_os.message == "saving step 15 to /scratch/ckpt failed: RuntimeError: boom"


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 999, 1000, 2_182_750, 3 * 10**12)] == ["0 B", "999 B", "1.0 kB", "2.2 MB", "3.0 TB"]


def test_the_policy_stops_at_the_nth_failure_in_a_row_or_at_the_last_chance():
    p = FailedSavePolicy(3)
    assert [p.stops(n, last_chance=False) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert p.stops(1, last_chance=True)
    never = FailedSavePolicy(0)
    assert not never.stops(100, last_chance=True)
    error = describe(enospc())
    assert "failed save 1 of 3 in a row; 2 more stop the run with exit code 78" in p.warning(error, 1)
    assert "1 more stops the run" in p.warning(error, 2) and "retries at the next save" in p.warning(error, 2)
    stop = p.stop_error(error, 3, last_chance=False)
    assert stop.exit_code == 78 and "stopping: 3 failed saves in a row (max_failed_saves=3)" in stop.message
    assert "`ckpt run` does not restart on exit code 78" in stop.hint
    assert "no later save would retry it" in p.stop_error(error, 1, last_chance=True).message


def test_save_failed_is_not_restarted_by_ckpt_run():
    assert ExitCode.SAVE_FAILED in RESTART_CANNOT_HELP


def test_max_failed_saves_and_its_older_spelling():
    assert CheckpointConfig("d").max_failed_saves == 3
    assert CheckpointConfig("d", on_save_error="stop").max_failed_saves == 1
    assert CheckpointConfig("d", on_save_error="continue").max_failed_saves == 0
    with pytest.raises(ValueError, match="max_failed_saves must be a non-negative integer"):
        CheckpointConfig("d", max_failed_saves=-1)
    with pytest.raises(ValueError, match="give only max_failed_saves"):
        CheckpointConfig("d", on_save_error="stop", max_failed_saves=5)
    with pytest.raises(ValueError, match="'stop' or 'continue'"):
        CheckpointConfig("d", on_save_error="retry")


def test_the_error_is_a_ckpt_error():
    assert isinstance(describe(enospc()), CkptError)
