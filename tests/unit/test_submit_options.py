"""``ckpt submit --dry-run``: the options a cluster admin reads in the script, and refusals."""

from __future__ import annotations

import json

import pytest

from ckpt_tool.cli.main import main


def submit(capsys, tmp_path, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(["submit", "--ckpt-dir", str(tmp_path / "ckpts"), "--dry-run", *args])
    out, err = capsys.readouterr()
    return e.value.code or 0, out, " ".join(err.split())


def test_constraint_syntax_of_slurm_is_accepted(capsys, tmp_path):
    code, out, err = submit(capsys, tmp_path, "--constraint", "a100&ib", "--", "train.py")
    assert code == 0, err
    assert "#SBATCH --constraint=a100&ib" in out


def test_cpus_default_to_one_per_rank_and_mem_is_passed(capsys, tmp_path):
    code, out, _ = submit(capsys, tmp_path, "--nproc-per-node", "4", "--mem", "64G", "--", "train.py")
    assert code == 0 and "#SBATCH --cpus-per-task=4" in out and "#SBATCH --mem=64G" in out
    code, out, _ = submit(capsys, tmp_path, "--gpus-per-node", "8", "--cpus-per-task", "96", "--", "train.py")
    assert code == 0 and "#SBATCH --cpus-per-task=96" in out


def test_the_script_exports_ckpt_dir_and_hands_over_to_ckpt_job(capsys, tmp_path):
    code, out, _ = submit(capsys, tmp_path, "--", "train.py")
    assert code == 0
    assert f"export CKPT_DIR={tmp_path / 'ckpts'}" in out
    assert 'exec "${CKPT[@]}" job ' in out  # which asks the OS for a rendezvous port (tests/unit/test_chain_driver.py)
    assert '--ckpt-dir "$CKPT_DIR"' in out


def test_a_training_command_writing_elsewhere_is_refused(capsys, tmp_path):
    code, out, err = submit(capsys, tmp_path, "--", "train.py", "--ckpt-dir", str(tmp_path / "other"))
    assert code == 2 and "writes checkpoints to" in err and "CKPT_DIR" in err and not out
    code, _, err = submit(capsys, tmp_path, "--", "train.py", f"--ckpt-dir={tmp_path / 'ckpts'}")
    assert code == 0, err  # the same directory, given both ways


def test_dry_run_json(capsys, tmp_path):
    code, out, _ = submit(capsys, tmp_path, "--json", "--", "train.py")
    report = json.loads(out)
    assert code == 0 and report["dry_run"] is True and "#SBATCH --requeue" in report["script"]


def test_free_port_prints_a_bindable_port(capsys):
    import socket

    with pytest.raises(SystemExit) as e:
        main(["free-port"])
    port = int(capsys.readouterr().out)
    assert e.value.code in (0, None) and 1024 <= port < 65536
    with socket.socket() as s:
        s.bind(("", port))


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--time", "25:99:99", "--time '25:99:99': 99 minutes is past 59"),
        ("--time", "1-25", "25 hours is past 23"),
        ("--time", "tomorrow", "not a SLURM time"),
        ("--mem", "lots", "--mem 'lots' is not a SLURM memory size"),
        ("--mem", "1.5G", "a whole number with an optional unit K, M, G or T"),
    ],
)
def test_a_time_or_memory_slurm_cannot_mean_is_refused_with_its_forms(capsys, tmp_path, option, value, words):
    code, out, err = submit(capsys, tmp_path, option, value, "--", "train.py")
    assert code == 2 and not out and words in err and "hint: e.g." in err, err
    if option == "--time":
        assert "DAYS-HOURS:MINUTES:SECONDS" in err
    assert not (tmp_path / "ckpts").exists()


def test_slurm_time_and_memory_forms_are_written_as_given(capsys, tmp_path):
    code, out, err = submit(capsys, tmp_path, "--time", "1-12", "--mem", "500", "--", "train.py")
    assert code == 0 and "#SBATCH --time=1-12" in out and "#SBATCH --mem=500" in out, err
