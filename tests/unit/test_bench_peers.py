"""The peers benchmark's arithmetic (bench/peers/run_peers.py, `make bench-peers`): what counts as
training going on again, the steps lost, and a table that says why a figure does not apply."""

from __future__ import annotations

import json

from .bench_scripts import BENCH, bench_module

peers = bench_module("peers/run_peers")


def rows(*steps: tuple[int, float, int]) -> list[dict]:
    return [{"step": s, "time": t, "pid": p} for s, t, p in steps]


def test_a_new_process_or_a_survivor_after_a_stall_is_training_again_and_the_step_in_flight_is_not():
    before = rows((24, 10.0, 1), (25, 10.02, 1))
    # the survivor's step in flight at the fault, then a new process (a restart) from step 21
    restarted = before + rows((26, 10.04, 1), (21, 13.0, 2))
    assert peers.going_again(restarted, len(before), survivor=1) == {"step": 21, "time": 13.0, "pid": 2}
    # torchft: the same process goes on after a pause longer than a step (its smaller quorum)
    paused = before + rows((26, 10.04, 1), (27, 15.1, 1))
    assert peers.going_again(paused, len(before), survivor=1)["step"] == 27
    assert peers.going_again(before + rows((26, 10.04, 1)), len(before), survivor=1) is None


def test_figures_that_do_not_apply_say_why_and_get_no_ratio():
    trials = {
        "ours": {"crash": [{"back_s": 0.5, "detection_s": 0.1, "group_back_s": 0.5, "steps_lost": 5}], "usr1": [{"back_s": 4.0}]},
        "lightning": {"usr1": [{"back_s": None}, {"back_s": 5.0}]},
        "plain": {"crash": [{"back_s": 2.0, "detection_s": 0.1, "group_back_s": 2.0, "steps_lost": 7}]},
    }
    table = peers.render(peers.summarize(trials), {"torchft": "no venv at X: run bash bench/peers/install.sh"})
    line = {row.split(" | ")[0].strip("| "): row for row in table.splitlines()}
    crash = line["crash -> next step trained (s)"]
    assert "n/a: restarts nothing (the job ends)" in crash and crash.endswith("| - | 0.25 |"), crash  # ours/lightning: none; ours/plain
    usr1 = line["USR1 -> next step trained after the requeue, scheduling excluded (s)"]
    assert "5 (5-5, n=1, 1 never)" in usr1 and "n/a: no SLURM requeue of its own" in usr1 and usr1.endswith("| 0.80 | - |"), usr1
    assert "torchft: not run: no venv at X" in table


def test_the_published_trials_render_to_the_table_in_benchmarks_md():
    published = json.loads((BENCH / "peers" / "results-2026-12-07.json").read_text())
    table = peers.render(peers.summarize(published["trials"]), published["missing"])
    benchmarks = (BENCH.parent / "BENCHMARKS.md").read_text()
    assert table.strip() in benchmarks, "BENCHMARKS.md's Peers table is not the rendering of bench/peers/results-2026-12-07.json"
