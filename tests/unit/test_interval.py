import math

import pytest

from ckpt_tool.core.interval import goodput, plan_interval, waste_table
from ckpt_tool.errors import CkptError


def test_daly_higher_order_interval_and_young():
    p = plan_interval(checkpoint_s=60, mtbf_s=24 * 3600)
    assert p.young_s == pytest.approx(math.sqrt(2 * 60 * 86400))
    r = 60 / (2 * 86400)
    assert p.interval_s == pytest.approx(p.young_s * (1 + math.sqrt(r) / 3 + r / 9) - 60)
    assert p.goodput == pytest.approx(1 - math.sqrt(2 * 60 / 86400), abs=2e-3)  # first-order waste sqrt(2C/M)


def test_the_optimum_beats_its_neighbours():
    p = plan_interval(checkpoint_s=120, mtbf_s=4 * 3600, restart_s=300)
    rows = waste_table(p)
    best = max(rows, key=lambda r: r[1])
    assert best[0] == pytest.approx(p.interval_s)
    assert all(r[2] >= best[2] for r in rows)


def test_checkpoint_longer_than_twice_the_mtbf_checkpoints_every_mtbf():
    assert plan_interval(checkpoint_s=1000, mtbf_s=400).interval_s == 400


def test_steps_from_step_time():
    assert plan_interval(60, 86400, step_s=2.0).interval_steps == round(plan_interval(60, 86400).interval_s / 2.0)


def test_goodput_falls_with_failures():
    assert goodput(3600, 60, 86400) > goodput(3600, 60, 3600)


@pytest.mark.parametrize(
    "kw",
    [
        {"checkpoint_s": 0, "mtbf_s": 10},
        {"checkpoint_s": 1, "mtbf_s": -1},
        {"checkpoint_s": 1, "mtbf_s": float("inf")},
        {"checkpoint_s": 1, "mtbf_s": 10, "restart_s": -1},
    ],
)
def test_bad_inputs_are_refused(kw):
    with pytest.raises(CkptError):
        plan_interval(**kw)


def test_ckpt_plan_json_and_errors(capsys, tmp_path):
    import json

    from ckpt_tool.cli.main import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    row = {"step": 9, "wall_s": 2.0, "compute_s": 1.9, "wait_s": 0.1, "score": 1.0, "individual": 1.0}
    (run_dir / "rank_health.n1.json").write_text(json.dumps({"node": "n1", "time": 1.0, "ranks": [{"rank": 0, **row}, {"rank": 1, **row}]}))
    with pytest.raises(SystemExit) as e:
        main(["plan", "--ckpt-seconds", "90", "--gpus", "512", "--gpu-mtbf-hours", "50000", "--run-dir", str(run_dir), "--json"])
    assert e.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    expected = plan_interval(90, 50000 / 512 * 3600, step_s=2.0)
    assert out["interval_seconds"] == pytest.approx(expected.interval_s, abs=1e-3)
    assert out["interval_steps"] == expected.interval_steps and out["expected_goodput"] == pytest.approx(expected.goodput, abs=1e-6)
    for bad in (
        ["plan", "--ckpt-seconds", "90"],
        ["plan", "--ckpt-seconds", "-1", "--mtbf-hours", "3"],
        ["plan", "--ckpt-seconds", "9", "--mtbf-hours", "3", "--gpus", "2", "--gpu-mtbf-hours", "5"],
    ):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--mtbf-hours", "-3"], 2, "--mtbf-hours must be a positive number, got -3"),
        (["--gpus", "8", "--gpu-mtbf-hours", "0"], 2, "--gpu-mtbf-hours must be a positive number, got 0"),
        (["--mtbf-hours", "3", "--restart-seconds", "-1"], 2, "--restart-seconds must be a non-negative number, got -1"),
        (["--mtbf-hours", "3", "--run-dir", "{tmp}/missing"], 3, "missing does not exist"),
        (["--mtbf-hours", "3", "--run-dir", "{tmp}"], 3, "holds no measured step time"),
        (["--mtbf-hours", "3", "--run-dir", "{tmp}", "--step-seconds", "2"], 2, "exclude each other"),
        (["--mtbf-hours", "3", "--local-seconds", "0"], 2, "--local-seconds must be a positive number, got 0"),
        (
            ["--mtbf-hours", "3", "--local-seconds", "5", "--local-restart-seconds", "-2"],
            2,
            "--local-restart-seconds must be a non-negative",
        ),
        (["--mtbf-hours", "3", "--local-seconds", "5", "--local-covers", "1"], 2, "between 0 and 1 (exclusive), got 1.0"),
    ],
)
def test_ckpt_plan_names_the_option_and_value_the_user_gave(capsys, tmp_path, args, code, message):
    from ckpt_tool.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["plan", "--ckpt-seconds", "90", *(a.format(tmp=tmp_path) for a in args)])
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == code, err
    assert message in err and "10800" not in err


def test_two_tier_plan_buys_goodput_when_local_saves_and_restarts_are_cheaper():
    from ckpt_tool.core.interval import plan_two_tier

    mtbf = 50000 / 512 * 3600
    p = plan_two_tier(90, 10, mtbf, 300, 60, covered=0.9)
    assert p.shared_only == plan_interval(90, mtbf, 300)
    assert p.local.mtbf_s == pytest.approx(mtbf / 0.9) and p.shared.mtbf_s == pytest.approx(mtbf / 0.1)
    assert p.local.interval_s < p.shared_only.interval_s < p.shared.interval_s  # saves often locally, rarely to shared
    assert p.goodput == pytest.approx(p.local.goodput * p.shared.goodput)
    assert p.goodput > p.shared_only.goodput
    # a fast tier as costly as the shared one, covering almost nothing, buys nothing
    same = plan_two_tier(90, 90, mtbf, 300, 300, covered=0.01)
    assert same.goodput <= same.shared_only.goodput + 1e-9


@pytest.mark.parametrize("covered", [0, 1, -0.5, 1.5, float("nan")])
def test_two_tier_plan_refuses_a_share_outside_0_1(covered):
    from ckpt_tool.core.interval import plan_two_tier

    with pytest.raises(CkptError) as e:
        plan_two_tier(90, 10, 3600, 300, 60, covered=covered)
    assert e.value.exit_code == 2


def test_ckpt_plan_with_a_fast_tier_gives_both_intervals_and_the_shared_only_plan(capsys):
    import json

    from ckpt_tool.cli.main import main
    from ckpt_tool.core.interval import plan_two_tier

    args = ["plan", "--ckpt-seconds", "90", "--gpus", "512", "--gpu-mtbf-hours", "50000", "--restart-seconds", "300"]
    with pytest.raises(SystemExit) as e:
        main([*args, "--local-seconds", "10", "--local-restart-seconds", "60", "--step-seconds", "2", "--json"])
    assert e.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    expected = plan_two_tier(90, 10, 50000 / 512 * 3600, 300, 60, 0.9, 2.0)
    assert out["local_interval_steps"] == expected.local.interval_steps and out["shared_interval_steps"] == expected.shared.interval_steps
    assert out["expected_goodput"] == pytest.approx(expected.goodput, abs=1e-6)
    assert out["shared_only"]["expected_goodput"] == pytest.approx(plan_interval(90, 50000 / 512 * 3600, 300).goodput, abs=1e-6)
    with pytest.raises(SystemExit):
        main([*args, "--local-seconds", "10"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fast tier every" in text and "shared tier alone" in text and "the fast tier buys" in text
