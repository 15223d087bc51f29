"""The README's Quick start, as a user runs it: the script in its own directory under torchrun,
SIGKILLed mid-run, started again with the same command, then `ckpt verify` from that directory;
and torchdata's StatefulDataLoader passed as ``data=``, as the Quick start says it can be."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from ckpt_tool import CheckpointConfig, CheckpointManager
from ckpt_tool.supervise.processes import kill_tree

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- quickstart: the test extracts the next python block -->"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


def quickstart_script() -> str:
    text = README.read_text()
    assert MARKER in text, "the README's Quick start lost its tested script"
    block = re.search(r"```python\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert block is not None
    return block.group(1)


def step_lines(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^step (\d+) loss .*$", text, re.M)}


def torchrun_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # as a user's shell has it: ckpt_tool comes from the installed package
    return env


def run_to_end(cwd: Path, ckpt: Path) -> str:
    proc = subprocess.run([*TORCHRUN, "train.py", str(ckpt)], cwd=cwd, env=torchrun_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def run_and_kill_after(cwd: Path, ckpt: Path, step: int) -> str:
    """Start the script and SIGKILL torchrun and its ranks once rank 0 printed ``step``: the whole
    process tree at once (torch starts each rank in a session of its own, so a kill of torchrun's
    process group left the ranks training on: they saved step 20 and the resume began there)."""
    proc = subprocess.Popen(
        [*TORCHRUN, "train.py", str(ckpt)], cwd=cwd, env=torchrun_env(), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    seen = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(f"step {step} "):
                kill_tree([proc.pid])  # a power cut: torchrun and every rank, SIGKILL at once
                break
    finally:
        proc.wait(timeout=60)
    assert any(line.startswith(f"step {step} ") for line in seen), "".join(seen)[-3000:]
    return "".join(seen)


@pytest.mark.slow
def test_the_readme_quickstart_is_killed_resumed_bit_identically_and_verified(tmp_path):
    script = quickstart_script()
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    for d in (ref_dir, run_dir):
        d.mkdir()
        (d / "train.py").write_text(script)
    reference = step_lines(run_to_end(ref_dir, ref_dir / "ckpt"))
    assert sorted(reference) == list(range(1, 31))

    first = step_lines(run_and_kill_after(run_dir, run_dir / "ckpt", 15))
    assert (run_dir / "ckpt" / "LATEST").read_text().strip() == "step_00000010"
    resumed = step_lines(run_to_end(run_dir, run_dir / "ckpt"))
    assert min(resumed) == 11, sorted(resumed)  # resumed from step 10: steps 11-15 are run again
    assert {s: first[s] for s in first} == {s: reference[s] for s in first}
    assert resumed == {s: reference[s] for s in range(11, 31)}  # the same bits, step for step

    # `ckpt verify` from the script's directory finds the recorded entry point train:build
    verify = subprocess.run(
        [sys.executable, "-m", "ckpt_tool.cli.main", "verify", "ckpt", "--nproc", "2"],
        cwd=run_dir,
        env=torchrun_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "exact" in verify.stdout, verify.stdout

    # an entry point whose module fails at import is named with the error and where, under
    # torchrun and in this process alike (it was the tail of torchrun's own traceback)
    (run_dir / "train.py").write_text(script.replace("import sys\n", "import sys\nint('ck')\n", 1))
    for nproc in ("2", "1"):
        broken = subprocess.run(
            [sys.executable, "-m", "ckpt_tool.cli.main", "verify", "ckpt", "--nproc", nproc],
            cwd=run_dir,
            env=torchrun_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        said = " ".join(broken.stderr.split())
        assert broken.returncode == 2, broken.stdout + broken.stderr
        assert "'train' failed while it was imported: ValueError: invalid literal" in said and "train.py line 3" in said, said
        assert "if __name__ == '__main__':" in said and "Traceback" not in broken.stderr, said


def test_a_torchdata_stateful_dataloader_as_data_resumes_where_it_stopped(tmp_path):
    """One process, as in the README: the batches after a resume are the ones the uninterrupted
    run drew, and so are the losses."""
    loader_mod = pytest.importorskip("torchdata.stateful_dataloader")
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))

    def train(directory: Path, steps: int, resume: bool) -> tuple[int, list[torch.Tensor], list[float]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = loader_mod.StatefulDataLoader(x, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
        manager = CheckpointManager(CheckpointConfig(directory, save_every=4), model=model, optimizer=optimizer, data=loader)
        start = (manager.resume() or 0) if resume else 0
        batches, losses, it = [], [], iter(loader)
        for step in range(start + 1, steps + 1):
            b = next(it)
            loss = model(b).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            batches.append(b)
            losses.append(loss.item())
            manager.maybe_save(step)
        manager.close(final=False)
        return start, batches, losses

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, ref_batches, ref_losses = train(tmp_path / "ref", 10, resume=False)
        train(tmp_path / "run", 6, resume=False)  # saves at 4; steps 5-6 are lost
        start, batches, losses = train(tmp_path / "run", 10, resume=True)
    assert start == 4
    assert all(torch.equal(a, b) for a, b in zip(batches, ref_batches[4:], strict=True))
    assert losses == ref_losses[4:]
