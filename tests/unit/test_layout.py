import pytest

from ckpt_tool.core import layout


def test_step_names_round_trip_and_sort_lexically():
    names = [layout.step_dir_name(s) for s in (0, 9, 10, 12345678)]
    assert names == sorted(names)
    assert [layout.parse_step_dir_name(n) for n in names] == [0, 9, 10, 12345678]


@pytest.mark.parametrize("bad", [-1, 10**8, 1.5, True, "3"])
def test_step_name_refuses_bad_steps(bad):
    with pytest.raises(ValueError):
        layout.step_dir_name(bad)


def test_parse_entry_classifies_partial_and_deleting_and_ignores_others():
    assert layout.parse_entry(layout.partial_dir_name(5)) == layout.DirEntry(layout.EntryKind.PARTIAL, 5, ".step_00000005.partial")
    assert layout.parse_entry(layout.deleting_dir_name(5)).kind is layout.EntryKind.DELETING
    for other in ("step_5", "step_000000050", "LATEST", "quarantine", "step_00000005.bak", ".step_00000005"):
        assert layout.parse_entry(other) is None
    assert layout.parse_step_dir_name(layout.partial_dir_name(5)) is None


def test_rank_of_file():
    assert layout.rank_of_file("__3_0.distcp") == 3
    assert layout.rank_of_file("rank_00012.state.json") == 12
    assert layout.rank_of_file(".metadata") == 0
    assert layout.rank_of_file("ckpt_manifest.json") is None
    assert layout.rank_of_file("__x_0.distcp") is None


def test_pointer_round_trip():
    assert layout.parse_pointer(layout.format_pointer(40)) == 40
    assert layout.parse_pointer("step_00000040") == 40


@pytest.mark.parametrize("garbage", ["", "\x00\x01", "step_40\n", "step_00000040\nstep_00000050\n", " step_00000040", "../step_00000040"])
def test_pointer_refuses_garbage(garbage):
    with pytest.raises(ValueError, match="LATEST"):
        layout.parse_pointer(garbage)
