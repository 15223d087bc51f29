import random

import numpy as np
import pytest
import torch

from ckpt_tool.errors import CkptError
from ckpt_tool.training import rng, state_codec


def test_round_trip_of_nested_state_with_tensors_and_special_floats():
    state = {
        "a": [1, 2.5, "x", None, True],
        7: {"t": torch.arange(6, dtype=torch.int64).reshape(2, 3), "b": torch.tensor([1.5], dtype=torch.bfloat16)},
        "inf": float("inf"),
        "nested": (1, (2, 3)),
        "np": np.arange(3, dtype=np.uint32),
    }
    back = state_codec.loads(state_codec.dumps(state), "x")
    assert back["a"] == [1, 2.5, "x", None, True]
    assert torch.equal(back[7]["t"], state[7]["t"]) and back[7]["b"].dtype == torch.bfloat16
    assert back["inf"] == float("inf")
    assert back["nested"] == [1, [2, 3]] and back["np"] == [0, 1, 2]


def test_rng_states_round_trip_through_json():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = state_codec.loads(state_codec.dumps({"rng": rng.capture()}), "x")["rng"]
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    rng.restore(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


class Opaque:
    pass


def test_objects_that_would_need_pickle_are_refused_at_save():
    with pytest.raises(CkptError, match="state.x has type Opaque"):
        state_codec.dumps({"x": Opaque()})


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"s:t": {"__tensor__": {"dtype": "object", "shape": [1], "data": ""}}}'])
def test_damaged_state_is_a_clear_error(raw):
    with pytest.raises(CkptError, match="not valid checkpoint state"):
        state_codec.loads(raw, "rank_00000.state.json")
