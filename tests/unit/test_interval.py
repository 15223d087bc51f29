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
    (run_dir / "timeouts.json").write_text(json.dumps({"durations": {"step": [0.0001, 2.0, 2.0, 3.0]}}))
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
        (["--mtbf-hours", "3", "--run-dir", "{tmp}/missing"], 3, "is not a directory"),
        (["--mtbf-hours", "3", "--run-dir", "{tmp}"], 3, "holds no measured step time"),
        (["--mtbf-hours", "3", "--run-dir", "{tmp}", "--step-seconds", "2"], 2, "exclude each other"),
    ],
)
def test_ckpt_plan_names_the_option_and_value_the_user_gave(capsys, tmp_path, args, code, message):
    from ckpt_tool.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["plan", "--ckpt-seconds", "90", *(a.format(tmp=tmp_path) for a in args)])
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == code, err
    assert message in err and "10800" not in err
