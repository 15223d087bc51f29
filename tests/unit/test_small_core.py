import pytest

from ckpt_tool.core.batch import BatchConfig, resolve_batch
from ckpt_tool.core.exactness import how_to_reproduce, trajectory_differences
from ckpt_tool.core.file_checks import DiskEntry, hash_problems, structure_problems
from ckpt_tool.core.index import format_event, parse_index
from ckpt_tool.core.manifest import FileEntry
from ckpt_tool.core.recovery import fallback_step
from ckpt_tool.errors import CkptError


def test_resolve_batch_derives_the_missing_value():
    assert resolve_batch(2, 4, None, 24) == BatchConfig(4, 3, 2)
    assert resolve_batch(2, None, 3, 24) == BatchConfig(4, 3, 2)
    assert resolve_batch(2, None, None, 24) == BatchConfig(12, 1, 2)
    assert resolve_batch(3, 4, 2, None).global_batch == 24
    assert resolve_batch(1, None, None, None) == BatchConfig(8, 1, 1)


@pytest.mark.parametrize(
    "args, message", [((2, 5, None, 24), "not divisible"), ((2, 4, 2, 24), "not the global batch"), ((4, None, 4, 8), "not divisible")]
)
def test_resolve_batch_refuses_with_reason(args, message):
    with pytest.raises(CkptError, match=message) as err:
        resolve_batch(*args)
    assert "--global-batch" in err.value.hint


def test_trajectory_differences_name_each_reason():
    saved = {"world_size": 2, "threads": 1, "torch": "2.13.0", "dtype": "float32"}
    assert trajectory_differences(saved, dict(saved)) == []
    diffs = trajectory_differences(saved, {**saved, "threads": 2, "world_size": 4})
    assert len(diffs) == 2 and any("thread count" in d for d in diffs) and any("world size" in d for d in diffs)
    assert how_to_reproduce(saved, {**saved, "threads": 2, "world_size": 4}) == ["--nproc 2", "OMP_NUM_THREADS=1"]
    assert how_to_reproduce(saved, dict(saved)) == []


def test_index_skips_torn_and_garbage_lines_and_says_which():
    lines = [
        format_event("commit", 1.0, step=10),
        format_event("commit", 2.0, step=20),
        '{"event": "commit", "st',  # torn by a crash
        format_event("quarantine", 3.0, step=20, reason="bad"),
        format_event("commit", 4.0, step=30),
        format_event("delete", 5.0, step=10),
        "garbage\n",
    ]
    log = parse_index(lines)
    assert [e.event for e in log.events] == ["commit", "commit", "quarantine", "commit", "delete"]
    assert log.skipped == (3, 7)
    note = log.skipped_note("index.jsonl")
    assert note is not None and "2 line(s)" in note and "line 3, 7" in note
    assert parse_index(lines[:2]).skipped_note("index.jsonl") is None


def test_fallback_step():
    assert fallback_step([10, 20, 30], 30) == 20
    assert fallback_step([10, 20, 30], None) == 30
    assert fallback_step([10], 10) is None


def test_structure_and_hash_problems():
    files = (FileEntry("a", 3, "h1", 0), FileEntry("b", 4, "h2", 0), FileEntry("c", 5, "h3", 1), FileEntry("d", 1, "h4", 1))
    disk = {
        "a": DiskEntry(3, True),
        "b": DiskEntry(2, True),
        "d": DiskEntry(1, False),
        "ckpt_manifest.json": DiskEntry(9, True),
        "zz": DiskEntry(1, True),
    }
    problems = {(p.file, p.what.split(" ")[0]) for p in structure_problems(files, disk)}
    assert problems == {("b", "size"), ("c", "missing"), ("d", "not"), ("zz", "extra")}
    [p] = hash_problems(files, {"a": "h1", "b": "XX"})
    assert (p.file, p.expected, p.found) == ("b", "h2", "XX")
