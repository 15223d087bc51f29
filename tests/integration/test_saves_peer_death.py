"""Under ``ckpt run`` the rank whose peer died says so in one line, without gloo's traceback."""

from __future__ import annotations

import signal

import pytest

from ckpt_tool.training.heartbeat import peer_died_line

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("warm", ["--warm", "--no-warm"])
def test_the_survivor_of_a_killed_peer_prints_one_line_and_no_traceback(supervised, warm):
    s = supervised(run_opts=(warm,), steps=20, save_every=5)
    s.start()
    s.wait_for_step(8)
    s.ranks()[1].send_signal(signal.SIGKILL)
    assert s.wait(timeout=300) == 0, s.log_tail()  # restarted from step 5 and finished
    log = s.log.read_text()
    assert "Traceback" not in log, log[-4000:]
    survivor = [line for line in log.splitlines() if line.startswith("rank 0: a peer rank died at step ")]
    assert len(survivor) == 1, log[-4000:]
    assert "its collective failed: " in survivor[0] and survivor[0].endswith("exiting: ckpt run decides the restart")


def test_the_line_names_the_rank_the_step_and_the_collectives_error():
    line = peer_died_line(0, 8, RuntimeError, RuntimeError("[pair.cc:537] Read error: Connection reset by peer.\nmore"))
    assert (
        line
        == "rank 0: a peer rank died at step 8 (its collective failed: RuntimeError: [pair.cc:537] Read error: Connection reset by peer.); exiting: ckpt run decides the restart"
    )
