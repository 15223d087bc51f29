"""`ckpt adopt`: a plain dcp.save directory, a safetensors file or a torch file becomes the first
checkpoint of a run; resume() starts from its weights (a fresh optimizer), and the run goes on
with ordinary checkpoints. Plus the reference recipe on 2 ranks from an adopted export."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from ckpt_tool.errors import CkptError
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.manager import CheckpointManager

from .test_cli_trust import cli, cli_json

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


def make_model(seed: int, hidden: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def write_source(kind: str, model: nn.Module, where: Path) -> Path:
    if kind == "dcp":
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(where / "plain"), no_dist=True)
        return where / "plain"
    if kind == "safetensors":
        st = pytest.importorskip("safetensors.torch")
        st.save_file(dict(model.state_dict()), str(where / "w.safetensors"))
        return where / "w.safetensors"
    torch.save(model.state_dict(), where / "w.pt")
    return where / "w.pt"


@pytest.mark.parametrize("kind", ["dcp", "safetensors", "torch"])
def test_adopted_weights_are_where_a_run_starts_and_it_goes_on_with_ordinary_checkpoints(kind, tmp_path, capsys):
    source_model = make_model(0)
    source = write_source(kind, source_model, tmp_path)
    code, out, err = cli(capsys, "adopt", source, tmp_path / "ckpt")
    assert code == 0 and "adopted 4 tensors" in out, err
    model = make_model(1)  # other initial weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    manager = CheckpointManager(CheckpointConfig(tmp_path / "ckpt", save_every=1), model, opt)
    assert manager.resume() == 0
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source_model.state_dict().values(), strict=True))
    loss = model(torch.ones(2, 8)).sum()
    loss.backward()
    opt.step()
    manager.maybe_save(1)
    manager.close()
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.read_latest() == 1 and store.check_files(1).ok and store.check_files(0).ok
    assert store.read_manifest(0).adopted and not store.read_manifest(1).adopted
    again = make_model(2)
    opt2 = torch.optim.AdamW(again.parameters(), lr=1e-2)
    m2 = CheckpointManager(CheckpointConfig(tmp_path / "ckpt"), again, opt2)
    assert m2.resume() == 1 and opt2.state  # an ordinary resume now: the optimizer's state too
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True))
    m2.close(final=False)


def test_a_model_the_weights_do_not_fit_is_a_clear_error_and_nothing_moves(tmp_path, capsys):
    source = write_source("torch", make_model(0), tmp_path)
    assert cli(capsys, "adopt", source, tmp_path / "ckpt")[0] == 0
    model = make_model(1, hidden=32)
    manager = CheckpointManager(CheckpointConfig(tmp_path / "ckpt"), model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(CkptError) as info:
        manager.resume()
    assert info.value.exit_code == 4 and "another shape" in info.value.message
    manager.close(final=False)
    assert CheckpointStore(tmp_path / "ckpt").committed_on_disk() == [0] and not (tmp_path / "ckpt" / "quarantine").exists()


class Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-adopt",))


def test_adopt_refuses_what_it_must_not_take(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"w": Payload()}))
    code, _, err = cli(capsys, "adopt", tmp_path / "evil.pt", tmp_path / "a")
    assert code == 2 and "weights_only" in err and not (tmp_path / "pwned-by-adopt").exists() and not (tmp_path / "a").exists()
    source = write_source("torch", make_model(0), tmp_path)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("mine")
    code, _, err = cli(capsys, "adopt", source, tmp_path / "busy")
    assert code == 2 and "not empty" in err and (tmp_path / "busy" / "x").read_text() == "mine"
    assert cli(capsys, "adopt", tmp_path / "missing.pt", tmp_path / "b")[0] == 3
    assert cli(capsys, "adopt", source, tmp_path / "c")[0] == 0
    code, _, err = cli(capsys, "adopt", tmp_path / "c", tmp_path / "d")
    assert code == 2 and "already a ckpt-tool checkpoint" in err


def test_a_plain_dcp_directory_is_named_with_the_way_in(tmp_path, capsys):
    source = write_source("dcp", make_model(0), tmp_path)
    code, _, err = cli(capsys, "list", source)
    assert code == 2 and "plain DCP checkpoint" in err and "ckpt adopt" in err


@pytest.mark.slow
def test_the_recipe_on_two_ranks_starts_from_an_adopted_export(recipe_checkpoints, reference_run, tmp_path, capsys):
    pytest.importorskip("safetensors")
    from ckpt_tool.recipes.launch import FAST_ARGS, read_metrics, recipe_args, run, torchrun_command

    ckpt = tmp_path / "src"
    shutil.copytree(recipe_checkpoints, ckpt)
    assert cli(capsys, "export", ckpt, "--out", tmp_path / "w.safetensors")[0] == 0  # with the optimizer's tensors
    code, adopted, _ = cli_json(capsys, "adopt", tmp_path / "w.safetensors", tmp_path / "ckpt")
    code, inspected, _ = cli_json(capsys, "inspect", ckpt)
    assert adopted["tensors"] == sum(e["key"].startswith("model.") and e["kind"] == "tensor" for e in inspected["entries"])  # weights only
    args = recipe_args(tmp_path / "ckpt", tmp_path / "m.jsonl", 3, 3, *FAST_ARGS)
    assert run(torchrun_command(2, args), tmp_path / "log.txt") == 0, (tmp_path / "log.txt").read_text()[-3000:]
    lines = read_metrics(tmp_path / "m.jsonl")
    fresh = reference_run.metrics_lines()
    assert [m.step for m in lines] == [1, 2, 3]
    assert lines[0].loss < fresh[0].loss - 0.1  # trained weights: a lower loss than a fresh start's first step
    assert json.loads((tmp_path / "ckpt" / "index.jsonl").read_text().splitlines()[0])["event"] in ("commit", "adopted")
    assert CheckpointStore(tmp_path / "ckpt").read_latest() == 3
