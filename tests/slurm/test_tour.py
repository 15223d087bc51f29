"""`make tour` as a test: the whole chain on the local cluster (3 nodes) tells its story, every
act as narrated, a verified final checkpoint and a picture, in under 5 minutes (the issue's
budget for 2 cores; the tour itself exits 1 past it)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_the_tour_tells_the_whole_story_in_under_five_minutes(slurm, tmp_path):
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.recipes.tour", "--work", str(tmp_path / "tour")], capture_output=True, text=True, timeout=420
    )
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    told = done.stdout
    for act in ("1. ckpt submit", "2. a preemption", "3. while it waits", "4. a node that keeps failing", "5. the story"):
        assert act in told, told[-3000:]
    assert "quarantined" in told and "left_behind" in told.replace("nodes_left_behind", "left_behind") and "bit for bit" in told
    assert "finished on 2 nodes" in told and "global batch 12" in told
    # the account: the preemption, n3's two crashes; the steps redone after each; the ETTR
    flat = " ".join(told.split())  # the narration wraps at the terminal's width (80 columns in a pipe)
    assert "where the time went: 3 interruptions, " in flat and "ETTR " in flat and "of the node-hours" in flat, told[-3000:]
    # the step of the preemption's checkpoint (and so of the rollback) depends on when USR1 lands
    assert (
        "1. preemption (USR1)" in flat and re.search(r"quarantined; rolled back to step \d+", flat) and "n3 left behind (shrink)" in flat
    ), told[-3000:]
    picture = tmp_path / "tour" / "story.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(picture) in told
    print(f"the tour took {elapsed:.0f} s")
    assert elapsed < 300
