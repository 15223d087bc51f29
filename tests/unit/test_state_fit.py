from ckpt_tool.core.state_fit import fit_problems

SAVED = {"model.w": (4, 2), "model.b": (4,), "optim.state.w.step": (), "optim.param_groups.0.lr": None}


def test_the_same_state_fits_and_a_subset_fits():
    assert fit_problems(dict(SAVED), SAVED) == []
    assert fit_problems({"model.w": (4, 2)}, SAVED) == []  # what the run leaves out is not a misfit


def test_missing_entries_are_counted_and_named():
    [problem] = fit_problems({**SAVED, "model.extra": (3,), "optim.param_groups.0.momentum": None}, SAVED)
    assert problem == "2 entries the run needs are not in the checkpoint: model.extra, optim.param_groups.0.momentum"


def test_other_shapes_and_kinds_are_named_with_both_sides():
    problems = fit_problems({"model.w": (8, 2), "model.b": None, "optim.param_groups.0.lr": (1,)}, SAVED)
    assert problems == [
        "1 tensors have another shape: model.w [8, 2] (saved [4, 2])",
        "2 entries are a tensor on one side and plain data on the other: model.b, optim.param_groups.0.lr",
    ]


def test_long_lists_are_cut_with_a_count():
    wanted = {f"model.l{i}": (1,) for i in range(9)}
    [problem] = fit_problems(wanted, {}, limit=3)
    assert problem == "9 entries the run needs are not in the checkpoint: model.l0, model.l1, model.l2, ..."
