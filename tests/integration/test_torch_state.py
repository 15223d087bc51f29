"""The state dicts DCP saves from and loads into (training.torch_state): the same state as torch's
own get_state_dict/set_state_dict, without a copy of the model for the zero gradients and
without copying what DCP loaded in place onto itself."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from ckpt_tool.training.torch_state import build_optimizer_state, live_state

OPTIMIZERS = [
    (torch.optim.AdamW, {"weight_decay": 0.1}),
    (torch.optim.Adam, {"foreach": False}),
    (torch.optim.SGD, {"momentum": 0.9}),
    (torch.optim.SGD, {}),
]


def make(seed: int, opt_cls: type, kw: dict) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, opt_cls(model.parameters(), lr=0.1, **kw)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for i in range(steps):
        torch.manual_seed(100 + i)
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize(("opt_cls", "kw"), OPTIMIZERS)
def test_the_built_optimizer_state_is_torchs_and_the_gradients_take_no_memory(opt_cls, kw):
    ours_model, ours = make(0, opt_cls, kw)
    torch_model, theirs = make(0, opt_cls, kw)
    params_before = [p.detach().clone() for p in ours_model.parameters()]
    with live_state(ours_model, ours) as live:
        grads = [p.grad for p in ours_model.parameters()]
        assert all(g is not None and all(s == 0 for s in g.stride()) for g in grads)  # stride-0 views: no memory
        assert all(g.untyped_storage().nbytes() <= 4 for g in grads)
        ours_sd = live.optim_sd
    theirs_sd = get_state_dict(torch_model, theirs)[1]  # torch's own: dense zero gradients + a step with lr=0
    assert all(p.grad is None for p in ours_model.parameters())
    assert ours.param_groups[0]["lr"] == 0.1
    assert all(torch.equal(a, p) for a, p in zip(params_before, ours_model.parameters(), strict=True))
    assert ours_sd["state"].keys() == theirs_sd["state"].keys()
    for fqn, entries in theirs_sd["state"].items():
        assert entries.keys() == ours_sd["state"][fqn].keys()
        for key, value in entries.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ours_sd["state"][fqn][key])), (fqn, key)


def test_nothing_is_built_when_the_optimizer_has_state_or_gradients():
    model, optimizer = make(0, torch.optim.AdamW, {})
    model(torch.randn(4, 8)).sum().backward()
    assert build_optimizer_state(optimizer) == []  # a gradient: torch would not build either
    assert not optimizer.state
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert build_optimizer_state(optimizer) == []  # state already there
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("opt_cls", "kw"), OPTIMIZERS)
def test_a_dcp_round_trip_through_live_state_restores_model_and_optimizer(tmp_path, opt_cls, kw):
    model, optimizer = make(0, opt_cls, kw)
    train(model, optimizer, 3)
    with live_state(model, optimizer) as live:
        dcp.save({"model": live.model_sd, "optim": live.optim_sd}, checkpoint_id=tmp_path, no_dist=True)
    reference = [p.detach().clone() for p in model.parameters()]
    train(model, optimizer, 2)
    expected = [p.detach().clone() for p in model.parameters()]

    fresh_model, fresh = make(1, opt_cls, kw)  # other weights, no optimizer state
    with live_state(fresh_model, fresh) as live:
        dcp.load({"model": live.model_sd, "optim": live.optim_sd}, checkpoint_id=tmp_path, no_dist=True)
        live.set_loaded()
    assert all(torch.equal(a, p) for a, p in zip(reference, fresh_model.parameters(), strict=True))
    train(fresh_model, fresh, 2)
    assert all(torch.equal(a, p) for a, p in zip(expected, fresh_model.parameters(), strict=True))  # bit-exact


class Counting(nn.Sequential):
    loads = 0

    def load_state_dict(self, *args, **kwargs):  # type: ignore[override]
        type(self).loads += 1
        return super().load_state_dict(*args, **kwargs)


def test_the_model_is_not_copied_onto_itself_but_a_replaced_entry_is_loaded(tmp_path):
    torch.manual_seed(0)
    model = Counting(nn.Linear(8, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    with live_state(model, optimizer) as live:
        live.model_sd["0.weight"].fill_(2.0)  # what DCP does: fills the given tensors in place
        live.set_loaded()
    assert Counting.loads == 0
    assert torch.equal(model[0].weight, torch.full((4, 8), 2.0))
    with live_state(model, optimizer) as live:
        live.model_sd["0.bias"] = torch.full((4,), 3.0)  # an entry DCP replaced instead of filling
        live.set_loaded()
    assert Counting.loads == 1
    assert torch.equal(model[0].bias, torch.full((4,), 3.0))
