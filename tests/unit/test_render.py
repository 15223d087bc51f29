"""The sbatch script: golden files, quoting of hostile values, refusal of bad directives."""

from __future__ import annotations

import itertools
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from ckpt_tool.core.render import JobSpec, directives, render, signal_lead
from ckpt_tool.errors import CkptError

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


def test_the_script_asks_slurm_for_requeues_and_traps_the_signals_before_it_starts_anything():
    """The protocol's parts as bash and sbatch read them, not as substrings anywhere (a comment
    would do): the directives of the header, the traps run at the top level, and the order of
    the commands (traps, then ckpt recover, then srun, each in the background and waited for)."""
    lines = render(spec(), TEMPLATE).splitlines()
    header = list(itertools.takewhile(lambda line: line.startswith("#SBATCH"), lines[1:]))  # right after the shebang
    directives = dict(line.removeprefix("#SBATCH --").partition("=")[::2] for line in header)
    assert {k: directives.get(k) for k in ("requeue", "open-mode", "signal")} == {
        "requeue": "",
        "open-mode": "append",  # a requeued job appends to its own output
        "signal": "B:USR1@120",  # USR1 to the batch shell, --signal-lead seconds before the limit
    }
    code = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    top = [line for line in lines if line.startswith("trap ")]  # not indented: run as the script starts
    assert top == ["trap 'ckpt_on_signal USR1' USR1", "trap 'ckpt_on_signal TERM' TERM"]

    def first(start: str) -> int:
        return next(i for i, line in enumerate(code) if line.startswith(start))

    recover, srun = first('"${CKPT[@]}" recover '), first("srun ")
    assert first("trap 'ckpt_on_signal USR1'") < recover < srun
    for started in (recover, srun):  # in the background, so that a trap runs while it works
        payload = first_after(code, started, "PAYLOAD=$!")
        assert code[payload + 1].startswith('wait "$PAYLOAD"'), code[payload : payload + 2]
    assert any(line.startswith('scontrol requeue "$SLURM_JOB_ID"') for line in code)
    assert 'RESTART="${SLURM_RESTART_COUNT:-0}"' in code  # the requeue count SLURM keeps


def first_after(lines: list[str], start: int, text: str) -> int:
    """The index of the first line from ``start`` on that starts with ``text``."""
    return next(i for i in range(start, len(lines)) if lines[i].startswith(text))


HOSTILE = ["it's", 'say "hi"', "$(touch {marker})", "`touch {marker}`", "a;touch {marker}", "line1\nline2", "*", "~root", "$HOME"]


def shell_values(script: str, marker: Path) -> tuple[list[str], str, str]:
    """Run the assignments and the training command line of the script in bash; return what
    bash sees, without running srun, ckpt or SLURM."""
    start = script.index("CKPT=(")
    assignments = script[start : script.index("ckpt_log()", start)]
    srun = script[script.index("srun ") :]
    command = srun[srun.index("-- ") + 3 : srun.index(" &\n")]
    probe = f"{assignments}\nprintf '%s\\0' \"$CKPT_DIR\" \"$RUN_DIR\"\nprintf '%s\\0' {command}\n"
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split("\0")
    return out[2:-1], out[0], out[1]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_paths_and_args_end_up_inert(tmp_path, hostile):
    marker = tmp_path / "pwned"
    value = hostile.format(marker=marker)
    folder = value.replace("\n", "_")  # a newline in a path is refused (below); in an argument it is data
    s = spec(
        command=("train.py", "--name", value, value), ckpt_dir=f"/data/{folder}/ck", run_dir=f"/data/{folder}/run", env=(("TAG", value),)
    )
    script = render(s, TEMPLATE)
    args, ckpt_dir, run_dir = shell_values(script, marker)
    assert args == ["train.py", "--name", value, value]
    assert (ckpt_dir, run_dir) == (f"/data/{folder}/ck", f"/data/{folder}/run")
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


def test_straggler_suspect_is_passed_to_every_nodes_ckpt_run():
    line = next(s for s in render(spec(straggler_suspect=True), TEMPLATE).splitlines() if "--max-restarts" in s)
    assert '--suspect-after "$SUSPECT_AFTER" --straggler-suspect --ckpt-dir' in line
    assert "--straggler-suspect" not in render(spec(), TEMPLATE)
