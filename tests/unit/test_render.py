"""The sbatch script: golden files, quoting of hostile values, refusal of bad directives."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

from ckpt_tool.core.render import JobSpec, directives, render, signal_lead
from ckpt_tool.errors import CkptError, ExitCode

GOLDEN = Path(__file__).parent / "golden"
TEMPLATE = (files("ckpt_tool.slurm_templates") / "train.sbatch.tmpl").read_text()


def spec(**kw) -> JobSpec:
    base = {
        "command": ("-m", "ckpt_tool.recipes.tiny_gpt", "--steps", "40"),
        "ckpt_dir": "/shared/ckpts/run42",
        "run_dir": "/shared/ckpts/run42/run",
        "ckpt": ("/venv/bin/python", "-m", "ckpt_tool.cli.main"),
        "version": "0.1.0",
        "created": "DRY-RUN",
    }
    base.update(kw)
    return JobSpec(**base)


@pytest.mark.parametrize(
    "name, kw",
    [
        ("basic", {}),
        (
            "full",
            {
                "nodes": 4,
                "min_nodes": 3,
                "suspect_after": 3,
                "gpus_per_node": 8,
                "cpus_per_task": 64,
                "mem": "400G",
                "time": "2-00:00:00",
                "partition": "gpu",
                "account": "ml",
                "qos": "high",
                "constraint": "h100&ib",
                "job_name": "llm-7b",
                "signal_lead_s": 420,
                "max_requeues": 3,
                "max_restarts": 2,
                "extra_sbatch": ("--exclusive",),
                "env": (("NCCL_DEBUG", "WARN"),),
            },
        ),
        ("spares", {"nodes": 2, "spares": 1, "node_check": "dcgmi diag -r 1 && echo 'ok: $(hostname)'", "node_check_at_start": True}),
    ],
)
def test_rendered_script_matches_golden_file(name, kw):
    # To accept a deliberate change: CKPT_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py
    script = render(spec(**kw), TEMPLATE)
    path = GOLDEN / f"{name}.sbatch"
    import os

    if os.environ.get("CKPT_UPDATE_GOLDEN") == "1":
        path.write_text(script)
    assert script == path.read_text()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_the_script_asks_slurm_for_requeues_and_hands_every_decision_to_ckpt_job():
    """The protocol's parts as bash and sbatch read them: the directives of the header (parsed),
    then only assignments and one ``exec ckpt job``: no line that decides (no trap, test, branch
    or loop: those are ckpt_tool/slurm/chain.py's), at most 80 lines."""
    lines = render(spec(), TEMPLATE).splitlines()
    assert len(lines) <= 80
    header = list(itertools.takewhile(lambda line: line.startswith("#SBATCH"), lines[1:]))  # right after the shebang
    directives = dict(line.removeprefix("#SBATCH --").partition("=")[::2] for line in header)
    assert {k: directives.get(k) for k in ("requeue", "open-mode", "signal")} == {
        "requeue": "",
        "open-mode": "append",  # a requeued job appends to its own output
        "signal": "B:USR1@120",  # USR1 to the batch shell (ckpt job, exec'd), --signal-lead seconds before the limit
    }
    code = [line.strip() for line in lines[1:] if line.strip() and not line.lstrip().startswith("#")]
    exec_at = next(i for i, line in enumerate(code) if line.startswith("exec "))
    for line in code[:exec_at]:  # NAME=value, export NAME=value, CKPT=(...): nothing runs, nothing branches
        assert re.fullmatch(r"(export )?[A-Z_]+=[^;&|`$<>]*(  # [^`$]*)?|CKPT=\([^;&|`$<>]*\)", line), line
    call = shlex.split(" ".join(line.removesuffix("\\") for line in code[exec_at:]))
    assert call[: call.index("--")] == [
        "exec", "${CKPT[@]}", "job", "--ckpt-dir", "$CKPT_DIR", "--run-dir", "$RUN_DIR", "--max-requeues", "$MAX_REQUEUES",
        "--min-nodes", "$MIN_NODES", "--suspect-after", "$SUSPECT_AFTER", "--nproc-per-node", "1", "--max-restarts", "3",
    ]  # fmt: skip
    assert not any(line.startswith("trap ") for line in code)


def run_script(script: str, tmp_path: Path) -> dict:
    """Run the rendered script in bash with ``ckpt`` replaced by a recorder: the argv and
    CKPT_DIR that ``ckpt job`` gets, without SLURM, srun or ckpt."""
    out = tmp_path / "argv.json"
    recorder = f"import json, os, sys; json.dump({{'argv': sys.argv[1:], 'CKPT_DIR': os.environ['CKPT_DIR']}}, open({str(out)!r}, 'w'))"
    baked = " ".join(shlex.quote(a) for a in spec().ckpt)  # the script's CKPT=(...) value
    assert baked in script
    subprocess.run(["bash", "-c", script.replace(baked, shlex.join([sys.executable, "-c", recorder]), 1)], check=True, timeout=30)
    return json.loads(out.read_text())


def test_the_script_execs_ckpt_job_with_the_jobs_values(tmp_path):
    got = run_script(render(spec(nodes=3, min_nodes=2, straggler_suspect=True, max_requeues=4), TEMPLATE), tmp_path)
    assert got["argv"] == [
        "job", "--ckpt-dir", "/shared/ckpts/run42", "--run-dir", "/shared/ckpts/run42/run", "--max-requeues", "4",
        "--min-nodes", "2", "--suspect-after", "2", "--nproc-per-node", "1", "--max-restarts", "3", "--straggler-suspect",
        "--", "-m", "ckpt_tool.recipes.tiny_gpt", "--steps", "40",
    ]  # fmt: skip
    assert got["CKPT_DIR"] == "/shared/ckpts/run42"


HOSTILE = ["it's", 'say "hi"', "$(touch {marker})", "`touch {marker}`", "a;touch {marker}", "line1\nline2", "*", "~root", "$HOME"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_paths_and_args_end_up_inert(tmp_path, hostile):
    marker = tmp_path / "pwned"
    value = hostile.format(marker=marker)
    folder = value.replace("\n", "_")  # a newline in a path is refused (below); in an argument it is data
    s = spec(
        command=("train.py", "--name", value, value), ckpt_dir=f"/data/{folder}/ck", run_dir=f"/data/{folder}/run", env=(("TAG", value),)
    )
    script = render(s, TEMPLATE)
    got = run_script(script, tmp_path)
    argv = got["argv"]
    assert argv[argv.index("--") + 1 :] == ["train.py", "--name", value, value]
    assert (got["CKPT_DIR"], argv[argv.index("--run-dir") + 1]) == (f"/data/{folder}/ck", f"/data/{folder}/run")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not marker.exists()


@pytest.mark.parametrize("field", ["ckpt_dir", "run_dir"])
def test_a_newline_in_a_path_is_refused(field):
    with pytest.raises(CkptError, match="holds a newline"):
        spec(**{field: "/data/x\n#SBATCH --uid=0\ntouch /tmp/pwned"})


@pytest.mark.parametrize("field", ["job_name", "partition", "account", "qos", "constraint"])
@pytest.mark.parametrize("hostile", ["a b", "x\n#SBATCH --uid=0", "$(id)", "a;b", "it's"])
def test_hostile_slurm_directive_values_are_refused(field, hostile):
    with pytest.raises(CkptError, match="characters SLURM would misread"):
        spec(**{field: hostile})


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"command": ()}, "no training command"),
        ({"time": "tomorrow"}, "not a SLURM time"),
        ({"nodes": 0}, "--nodes must be >= 1"),
        ({"max_requeues": -1}, ">= 0"),
        ({"env": (("BAD-NAME", "x"),)}, "not a valid variable name"),
        ({"extra_sbatch": ("--exclusive\n#SBATCH --uid=0",)}, "newline"),
    ],
)
def test_bad_requests_are_refused(kw, message):
    with pytest.raises(CkptError, match=message):
        spec(**kw)


def test_signal_lead_accounts_for_checkpoint_time_and_slurm_jitter():
    assert signal_lead(None) == 300
    assert signal_lead(5.0) == 120  # floor
    assert signal_lead(100.0) == 260  # 2 x 100 + 60 s of SLURM warning jitter
    assert "#SBATCH --signal=B:USR1@260" in directives(spec(signal_lead_s=signal_lead(100.0)))


def test_min_nodes_renders_a_node_range_and_is_checked():
    assert "#SBATCH --nodes=2-3" in render(spec(nodes=3, min_nodes=2), TEMPLATE)
    assert "#SBATCH --nodes=3\n" in render(spec(nodes=3, min_nodes=3), TEMPLATE)
    assert "MIN_NODES=2\n" in render(spec(nodes=3, min_nodes=2), TEMPLATE)
    for bad in (0, 4):
        with pytest.raises(CkptError, match="--min-nodes"):
            spec(nodes=3, min_nodes=bad)


def test_straggler_suspect_is_passed_to_every_nodes_ckpt_run(tmp_path):
    from ckpt_tool.slurm.chain import RunSpec, srun_argv

    argv = run_script(render(spec(straggler_suspect=True), TEMPLATE), tmp_path)["argv"]
    assert "--straggler-suspect" in argv[: argv.index("--")]
    run = RunSpec(
        ckpt=("ckpt",), ckpt_dir="/c", run_dir="/c/run", command=("train.py",), straggler_suspect=argv.count("--straggler-suspect") == 1
    )
    srun = srun_argv(run, "7", 0, 0, 2, "n1:29500")
    assert srun[srun.index("--suspect-after") : srun.index("--ckpt-dir")] == ["--suspect-after", "3", "--straggler-suspect"]
    assert "--straggler-suspect" not in render(spec(), TEMPLATE)


def test_spares_are_allocated_beside_the_training_nodes_and_kept_out_of_the_world():
    s = spec(nodes=2, spares=1)
    assert s.nodes_range == "3" and s.world_size == 2
    lines = directives(s)
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --ntasks-per-node=1" in lines and "#SBATCH --no-kill" in lines
    assert spec(nodes=2, spares=2, min_nodes=1).nodes_range == "1-4"
    script = render(spec(nodes=2, spares=1), TEMPLATE)
    assert "--train-nodes 2" in script and "--node-check" not in script
    assert "--train-nodes" not in render(spec(nodes=2), TEMPLATE)  # no spares: every node trains, as before


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"spares": -1}, "--spares must be >= 0"),
        ({"node_check": "  "}, "is not one command line"),
        ({"node_check": "check.sh\nrm -rf /"}, "is not one command line"),
        ({"node_check_at_start": True}, "--node-check-at-start needs --node-check CMD"),
        ({"node_check": "true", "node_check_timeout_s": 0}, "--node-check-timeout must be >= 1"),
    ],
)
def test_bad_spare_options_are_refused_naming_the_option(kw, words):
    with pytest.raises(CkptError) as exc:
        spec(**kw)
    assert words in exc.value.message and exc.value.exit_code == ExitCode.USAGE
