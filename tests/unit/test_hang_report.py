"""Who hung the job (core.hang_report): stacks and beats as plain data in, the culprit out."""

from __future__ import annotations

from ckpt_tool.core.hang_report import (
    RankStacks,
    analyse,
    collective_of,
    header_line,
    moving,
    parse_rank_file,
    parse_stacks,
    rank_ranges,
    report_of,
    training_thread,
    user_frame,
)
from ckpt_tool.core.node_ledger import fold_health

TORCH = "/v/lib/python3.11/site-packages/torch"
FAULTHANDLER_BUSY = """Thread 0x00007f29a4ef96c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f29dce97b80 (most recent call first):
  File "/home/u/train.py", line 70 in spin
  File "/home/u/train.py", line 118 in main
  File "/home/u/train.py", line 130 in <module>
"""
FAULTHANDLER_WAITING = f'''Current thread 0x00007f29dce97b80 (most recent call first):
  File "{TORCH}/distributed/distributed_c10d.py", line 2950 in all_reduce
  File "{TORCH}/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/train.py", line 121 in main
  File "/home/u/train.py", line 130 in <module>
'''
PY_SPY_FROZEN = f"""Process 1169: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 1169 (idle): "MainThread"
    item ({TORCH}/_tensor.py:40)
    main (/home/u/train.py:118)
    <module> (/home/u/train.py:130)
"""


def rank(r: int, text: str, step: int = 411, node: str = "n1", answered: str = "faulthandler", **kw) -> RankStacks:
    return RankStacks(r, node, 100 + r, step, "step", 6.1, "sleeping", answered, 0.02, threads=parse_stacks(text), **kw)


def test_both_dump_formats_parse_to_frames_innermost_first():
    [other, main] = parse_stacks(FAULTHANDLER_BUSY)
    assert training_thread([other, main]) == main
    assert [f.short for f in main] == ["train.py:70 in spin", "train.py:118 in main", "train.py:130 in <module>"]
    [spy] = parse_stacks(PY_SPY_FROZEN)
    assert spy[0].func == "item" and spy[1].short == "train.py:118 in main"
    assert user_frame(spy).short == "train.py:118 in main"  # torch's frame is not the user's
    assert collective_of(parse_stacks(FAULTHANDLER_WAITING)[0]) == "all_reduce"
    assert collective_of(main) is None


def test_the_rank_outside_the_collective_the_others_wait_in_is_the_culprit():
    ranks = [
        rank(0, FAULTHANDLER_WAITING),
        rank(1, FAULTHANDLER_BUSY, node="n2"),
        rank(2, FAULTHANDLER_WAITING),
        rank(3, FAULTHANDLER_WAITING),
    ]
    report = analyse(ranks, world=4)
    assert report.culprits == (1,) and report.victims == (0, 2, 3) and report.culprit_nodes() == ("n2",)
    assert report.reason == "not inside the collective the others wait in"
    assert report.summary(6.1) == "rank 1 on n2 in train.py:70 in spin; ranks 0,2-3 waiting in all_reduce after step 411, 6.1 s"


def test_a_frozen_rank_is_the_culprit_even_when_read_from_outside_inside_a_collective():
    frozen = rank(2, FAULTHANDLER_WAITING, answered="py-spy", note="did not answer in 2 s (state stopped); read with py-spy")
    report = analyse([rank(0, FAULTHANDLER_WAITING), rank(1, FAULTHANDLER_WAITING), frozen], world=3)
    assert report.culprits == (2,) and report.reason.startswith("could not answer")
    assert "rank 2 on n1, frozen: did not answer in 2 s (state stopped)" in report.summary()
    silent = RankStacks(2, "n1", 102, 411, "step", 6.0, "stopped", "", None, "could not answer in 2 s (state stopped)")
    assert analyse([rank(0, FAULTHANDLER_WAITING), silent]).culprits == (2,)


def test_one_step_behind_when_every_rank_waits_in_a_collective():
    ranks = [rank(0, FAULTHANDLER_WAITING, step=412), rank(1, FAULTHANDLER_WAITING, step=411), rank(2, FAULTHANDLER_WAITING, step=412)]
    report = analyse(ranks)
    assert report.culprits == (1,) and report.reason == "a step behind the others"


def test_the_same_collective_at_the_same_step_everywhere_is_unattributed_not_guessed():
    report = analyse([rank(r, FAULTHANDLER_WAITING) for r in range(4)], world=4)
    assert not report.attributed and report.culprits == () and report.culprit_nodes() == ()
    assert "the network?" in report.reason
    assert report.summary().startswith("unattributed: every rank waits in all_reduce at the same step")
    assert all(v.role == "unknown" for v in report.verdicts)


def test_ranks_of_a_node_that_did_not_answer_are_the_culprits():
    report = analyse([rank(0, FAULTHANDLER_WAITING), rank(1, FAULTHANDLER_WAITING)], world=4)
    assert report.culprits == (2, 3) and report.missing == (2, 3)
    assert "rank 2 (no stacks: its node did not answer)" in report.summary()


def test_nothing_at_all_is_unattributed():
    assert analyse([]).reason == "no rank answered and no stacks were written" and not analyse([]).attributed


def test_a_rank_file_round_trips_its_header_and_code_line():
    head = header_line({"rank": 3, "node": "n2", "pid": 7, "step": 411, "phase": "step", "silent_s": 6.1, "state": "running",
                        "answered": "faulthandler", "answer_s": 0.02, "note": None})  # fmt: skip
    text = f"{head}\n# code /home/u/train.py:70 x += 1\n{FAULTHANDLER_BUSY}"
    r = parse_rank_file(text)
    assert (r.rank, r.node, r.pid, r.step, r.silent_s, r.state, r.answered) == (3, "n2", 7, 411, 6.1, "running", "faulthandler")
    assert r.code == {"/home/u/train.py:70": "x += 1"}
    assert parse_rank_file(FAULTHANDLER_BUSY) is None  # not our file
    report = analyse([r, rank(0, FAULTHANDLER_WAITING)])
    assert "rank 3 on n2 in train.py:70 in spin (x += 1)" in report.summary()
    assert report_of(report.to_json()) == report


def test_rank_ranges():
    assert rank_ranges([3]) == "rank 3" and rank_ranges([0, 1, 2, 4, 6, 7]) == "ranks 0-2,4,6-7"


def test_the_ledger_blames_the_hang_culprits_node_not_its_victims():
    start = [{"event": "start", "node": n, "round": "r", "attempt": 0, "time": 0.0} for n in ("n1", "n2", "n3")]

    def hang(node: str, r: int, culprit: bool) -> dict:
        return {"event": "hang", "node": node, "round": "r", "attempt": 0, "time": 1.0, "rank": r, "local_rank": 0,
                "step": 411, "phase": "step", "culprit": culprit}  # fmt: skip

    ledger = fold_health([*start, hang("n1", 0, False), hang("n2", 1, True), hang("n3", 2, False)])
    by = {n.node: n for n in ledger.nodes}
    assert by["n2"].in_a_row == 1 and "hung" in by["n2"].last_reason and by["n1"].total == 0 and by["n3"].total == 0
    unattributed = fold_health([*start, hang("n1", 0, False), hang("n2", 1, False), hang("n3", 2, False)])
    assert all(n.total == 0 for n in unattributed.nodes)


def test_a_job_whose_ranks_all_beat_a_moment_ago_is_moving():
    from dataclasses import replace

    fresh = [replace(rank(r, FAULTHANDLER_WAITING), silent_s=0.3) for r in range(2)]
    assert moving(fresh) == 0.3
    assert moving([*fresh, rank(2, FAULTHANDLER_BUSY)]) is None  # one silent 6.1 s
    assert moving([]) is None


def test_a_node_its_peers_cannot_reach_is_cut_off_and_its_ranks_are_the_culprits():
    from ckpt_tool.core.hang_report import cut_off

    reach = {"n1": {"n2": False, "n3": True}, "n2": {"n1": False, "n3": False}, "n3": {"n1": True, "n2": False}}
    assert cut_off(reach) == ("n2",)
    assert cut_off({"n1": {"n2": False, "n3": True}, "n3": {"n1": True, "n2": False}}) == ("n2",)  # n2 wrote nothing
    assert cut_off({"n1": {"n2": False}, "n2": {"n1": False}}) == ()  # two nodes: the same from both ends
    assert cut_off({"n1": {"n2": True, "n3": True}, "n2": {"n1": True, "n3": True}, "n3": {"n1": True, "n2": True}}) == ()
    assert cut_off({}) == ()
    ranks = [rank(0, FAULTHANDLER_WAITING, node="n1"), rank(1, FAULTHANDLER_WAITING, node="n2"), rank(2, FAULTHANDLER_WAITING, node="n3")]
    report = analyse(ranks, world=3, reach=reach)
    assert report.culprits == (1,) and report.culprit_nodes() == ("n2",) and "cannot be reached by its peers" in report.reason
    assert report.summary().startswith("rank 1 on n2, cut off (its peers cannot reach it), in train.py:121 in main")
    assert report_of(report.to_json()) == report
    # the same stacks without the network's evidence: every rank in the same collective, nobody named
    assert not analyse(ranks, world=3).attributed


def test_a_users_installed_package_is_the_users_code_torch_and_the_standard_library_are_not():
    from ckpt_tool.core.hang_report import Frame

    mine = Frame("/venv/lib/python3.11/site-packages/mytrain/train.py", 40, "main")
    frames = [Frame(f"{TORCH}/_tensor.py", 1, "item"), Frame("/usr/lib/python3.11/threading.py", 2, "wait"),
              Frame("/venv/lib/python3.11/site-packages/ckpt_tool/training/manager.py", 3, "maybe_save"), mine]  # fmt: skip
    assert user_frame(frames) == mine
    assert user_frame(frames[:3]) is None


def test_a_rank_already_gone_when_asked_is_not_a_frozen_culprit():
    gone = RankStacks(2, "n2", 102, 411, "step", 6.0, "gone", "", None, "could not answer in 2 s (state gone)")
    report = analyse([rank(0, FAULTHANDLER_WAITING), rank(1, FAULTHANDLER_BUSY), gone], world=3)
    assert report.culprits == (1,) and report.reason == "not inside the collective the others wait in"
