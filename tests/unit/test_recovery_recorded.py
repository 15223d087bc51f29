"""`ckpt recover`'s decision as recover.json keeps it, and when the ranks may take it as theirs
(plain data; the torchrun side is tests/integration/test_recovery_follows.py)."""

from __future__ import annotations

import json

from ckpt_tool.core.recovery import Recorded, stale_because
from ckpt_tool.store import recovery

DECIDED = {
    "action": "resume",
    "step": 20,
    "world_size": 2,
    "store": "/data/ckpt",
    "facts": "f1",
    "reshard": None,
    "hashes_checked": False,
}


def test_a_current_decision_is_followed():
    recorded = Recorded.from_json(DECIDED)
    assert recorded == Recorded(20, 2, "/data/ckpt", "f1", None, False)
    assert stale_because(recorded, "/data/ckpt", 20, "f1", 2) is None


def test_a_stale_decision_says_why_it_is_not_followed():
    recorded = Recorded.from_json(DECIDED)
    assert "taken on /data/ckpt, not /other" in stale_because(recorded, "/other", 20, "f1", 2)
    assert "chose step 20 and LATEST now names step 25" in stale_because(recorded, "/data/ckpt", 25, "f1", 2)
    assert "LATEST now names nothing" in stale_because(recorded, "/data/ckpt", None, "f1", 2)
    assert "changed since (a save, rollback" in stale_because(recorded, "/data/ckpt", 20, "f2", 2)
    assert "planned for 2 ranks, this run has 4" in stale_because(recorded, "/data/ckpt", 20, "f1", 4)
    # recover run without --world-size planned no reshard: the step stands at any size
    assert stale_because(Recorded.from_json({**DECIDED, "world_size": None}), "/data/ckpt", 20, "f1", 4) is None


def test_what_is_not_a_decision_to_resume_from_is_none():
    assert Recorded.from_json({**DECIDED, "action": "fresh", "step": None}) is None
    assert Recorded.from_json({k: v for k, v in DECIDED.items() if k != "facts"}) is None  # an older recover.json
    assert Recorded.from_json([1, 2]) is None and Recorded.from_json({**DECIDED, "step": "20"}) is None


def test_a_torn_recover_json_is_no_decision(tmp_path):
    (tmp_path / "recover.json").write_text(json.dumps(DECIDED)[:40])
    assert recovery.read_recorded(tmp_path) is None
    assert recovery.read_recorded(tmp_path / "missing") is None
