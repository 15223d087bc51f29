"""The store on a real filesystem, without torch: commit, pointer, validation, clean-up, retention."""

import os
import shutil
import time
from pathlib import Path

import pytest

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.checksums import hash_files
from ckpt_tool.store.prune import prune
from ckpt_tool.store.recovery import clean_up_after_crash
from ckpt_tool.store.store import CheckpointStore


def stage(store: CheckpointStore, step: int, run_id: str = "run1", payload: bytes | None = None, more_files: int = 0) -> Manifest:
    """Write a staged checkpoint of two 'rank' files (and ``more_files`` small ones of rank 1)
    and return its manifest (not committed)."""
    partial = store.partial_path(step)
    partial.mkdir()
    data = {"__0_0.distcp": payload or os.urandom(1000), "__1_0.distcp": os.urandom(500), ".metadata": b"meta"}
    data.update({f"__1_{k}.distcp": os.urandom(k) for k in range(1, more_files + 1)})
    for name, content in data.items():
        (partial / name).write_bytes(content)
    digests = hash_files(partial, sorted(data), run_id, step)
    files = tuple(FileEntry(d.name, d.bytes, d.hash, layout.rank_of_file(d.name)) for d in digests)
    return Manifest(run_id=run_id, step=step, created_at=time.time(), world_size=2, files=files)


def commit(store: CheckpointStore, step: int, **kw) -> Manifest:
    m = stage(store, step, **kw)
    store.commit(step, m)
    return m


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "ckpts", create=True)


def test_commit_moves_latest_and_logs(store):
    assert store.read_latest() is None
    commit(store, 10)
    commit(store, 20)
    assert store.read_latest() == 20
    assert (store.root / "LATEST").read_text() == "step_00000020\n"
    assert not store.partial_path(20).exists()
    assert [(e.event, e.step) for e in store.events()] == [("commit", 10), ("commit", 20)]
    assert store.check_files(20).ok


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(CkptError) as err:
        CheckpointStore(tmp_path / "nope")
    assert err.value.exit_code == ExitCode.NOT_FOUND and "does not exist" in err.value.message


def test_garbage_latest_is_reported_with_rollback_hint(store):
    commit(store, 10)
    (store.root / "LATEST").write_bytes(b"\x00garbage")
    with pytest.raises(CkptError) as err:
        store.read_latest()
    assert "LATEST" in err.value.message and "rollback" in err.value.hint


@pytest.mark.parametrize("more_files", [0, 100], ids=["3 files", "103 files: stats in parallel"])
@pytest.mark.parametrize("damage", ["bitflip", "truncate", "delete", "extra", "symlink"])
def test_validate_names_each_problem(store, tmp_path, damage, more_files):
    commit(store, 10, more_files=more_files)
    d = store.step_path(10)
    shard = d / "__0_0.distcp"
    if damage == "bitflip":
        raw = bytearray(shard.read_bytes())
        raw[500] ^= 0x04
        shard.write_bytes(bytes(raw))
        expect = ("__0_0.distcp", "content hash differs")
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-1])
        expect = ("__0_0.distcp", "size differs")
    elif damage == "delete":
        shard.unlink()
        expect = ("__0_0.distcp", "missing file")
    elif damage == "extra":
        (d / "evil.py").write_text("x")
        expect = ("evil.py", "extra file")
    else:
        outside = tmp_path / "outside"
        outside.write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(outside)
        expect = ("__0_0.distcp", "not a regular file")
    result = store.check_files(10)
    assert not result.ok
    assert [(p.file, p.what[: len(expect[1])]) for p in result.problems] == [expect]


def test_shard_copied_from_another_step_is_detected_even_with_its_manifest_line(store):
    m10 = commit(store, 10)
    commit(store, 20)
    # Copy step 10's shard into step 20 AND patch step 20's manifest with step 10's entry.
    shutil.copy(store.step_path(10) / "__0_0.distcp", store.step_path(20) / "__0_0.distcp")
    m20 = store.read_manifest(20)
    entry10 = next(f for f in m10.files if f.path == "__0_0.distcp")
    patched = Manifest(**{**m20.__dict__, "files": tuple(entry10 if f.path == entry10.path else f for f in m20.files)})
    (store.step_path(20) / layout.MANIFEST_NAME).write_text(patched.to_json())
    problems = store.check_files(20).problems
    assert [p.file for p in problems] == ["__0_0.distcp"]
    assert "copied from another step" in problems[0].what


def test_manifest_of_another_step_is_refused(store):
    commit(store, 10)
    commit(store, 20)
    shutil.copy(store.step_path(10) / layout.MANIFEST_NAME, store.step_path(20) / layout.MANIFEST_NAME)
    with pytest.raises(CkptError, match="describes step 10, not 20"):
        store.read_manifest(20)


def test_clean_up_removes_partials_and_half_deletes_and_rolls_forward(store):
    commit(store, 10)
    stage(store, 20)  # crash before the manifest: a partial
    (store.root / layout.deleting_dir_name(5)).mkdir()  # crash during a retention delete
    m30 = stage(store, 30)  # crash between rename and pointer move:
    store.commit(30, m30)
    (store.root / "LATEST").write_text(layout.format_pointer(10))
    actions = clean_up_after_crash(store, roll_forward=lambda s: store.check_files(s).ok)
    assert len(actions) == 3
    assert store.read_latest() == 30
    assert sorted(os.listdir(store.root)) == [".lock", "LATEST", "index.jsonl", "step_00000010", "step_00000030"]


def test_clean_up_quarantines_an_invalid_unpointed_step(store):
    commit(store, 10)
    m = stage(store, 20)
    store.commit(20, m)
    (store.step_path(20) / "__1_0.distcp").write_bytes(b"short")
    (store.root / "LATEST").write_text(layout.format_pointer(10))
    clean_up_after_crash(store, roll_forward=lambda s: store.check_files(s).ok)
    assert store.read_latest() == 10
    assert not store.step_path(20).exists()
    assert [p.name.split(".")[0] for p in store.quarantine_root.iterdir()] == ["step_00000020"]


def test_retention_deletes_only_old_committed_steps_after_commit(store):
    for s in (10, 20, 30, 40, 50):
        commit(store, s)
        prune(store, RetentionPolicy(keep_last=2, keep_every=20), known_good=s)
    assert store.committed_on_disk() == [20, 40, 50]
    assert not any(n.endswith(".deleting") for n in os.listdir(store.root))
    assert [e.step for e in store.events() if e.event == "delete"] == [10, 30]


def test_retention_keeps_latest_after_a_rollback_and_never_touches_quarantine(store):
    for s in (10, 20, 30):
        commit(store, s)
    store.quarantine(30, "bad")
    store.set_latest(20, "step 30 bad")
    assert prune(store, RetentionPolicy(keep_last=1), confirm=lambda s: store.check_files(s).ok) == [10]
    assert store.committed_on_disk() == [20]
    assert len(list(store.quarantine_root.iterdir())) == 1


def test_commit_over_a_stale_unpointed_step_quarantines_it_first(store):
    commit(store, 10)
    commit(store, 20)
    store.set_latest(10, "rolled back")
    commit(store, 20)  # the run re-did step 20
    assert store.read_latest() == 20 and store.check_files(20).ok
    assert len(list(store.quarantine_root.iterdir())) == 1


def test_set_latest_refuses_a_missing_step(store):
    commit(store, 10)
    with pytest.raises(CkptError, match="no committed checkpoint"):
        store.set_latest(99, "x")
    assert store.read_latest() == 10


def damage(store: CheckpointStore, step: int) -> None:
    path = store.step_path(step) / "__0_0.distcp"
    raw = bytearray(path.read_bytes())
    raw[10] ^= 1
    path.write_bytes(bytes(raw))


def validate_and_record(store: CheckpointStore):
    def confirm(step: int) -> bool:
        result = store.check_files(step)
        store.record_check(step, "validated", result.ok, [str(p) for p in result.problems])
        return result.ok

    return confirm


def test_retention_never_deletes_without_a_kept_checkpoint_known_to_be_valid(store):
    for s in (10, 20, 30):
        commit(store, s)
    with pytest.raises(CkptError, match="known to pass validation: nothing deleted"):
        prune(store, RetentionPolicy(keep_last=1))
    assert store.committed_on_disk() == [10, 20, 30]


def test_prune_skips_a_damaged_latest_and_keeps_the_newest_valid_one(store):
    """LATEST (30) is damaged and nobody knows yet: validating before deleting finds it, records
    it invalid, and keep-last 1 then keeps 20 (which passes) instead of deleting it."""
    for s in (10, 20, 30):
        commit(store, s)
    damage(store, 30)
    assert prune(store, RetentionPolicy(keep_last=1), dry_run=True, confirm=lambda s: store.check_files(s).ok) == [10]
    assert store.committed_on_disk() == [10, 20, 30]  # the dry run deleted nothing
    assert prune(store, RetentionPolicy(keep_last=1), confirm=validate_and_record(store)) == [10]
    assert store.committed_on_disk() == [20, 30]
    assert store.check_files(20).ok
    [delete] = [e for e in store.events() if e.event == "delete"]
    assert delete.data["reason"] == "retention: keep the last 1; step 20 passed validation"


def test_prune_when_every_checkpoint_is_damaged_deletes_nothing(store):
    for s in (10, 20, 30):
        commit(store, s)
        damage(store, s)
    assert prune(store, RetentionPolicy(keep_last=1), confirm=validate_and_record(store)) == []
    assert store.committed_on_disk() == [10, 20, 30]


def test_index_append_after_a_torn_last_line_starts_a_new_line(store):
    commit(store, 10)
    with open(store.root / layout.INDEX_NAME, "a") as f:
        f.write('{"event": "commit", "step": 2')  # a crash mid-append
    commit(store, 20)
    log = store.event_log()
    assert [(e.event, e.step) for e in log.events] == [("commit", 10), ("commit", 20)]
    assert log.skipped == (2,)


def test_a_garbage_latest_is_repaired_once_with_its_cause(store):
    for s in (10, 20, 30):
        commit(store, s)
    (store.root / layout.LATEST_NAME).write_bytes(b"\x00garbage")
    actions = clean_up_after_crash(store, roll_forward=lambda s: store.check_files(s).ok)
    assert len(actions) == 1 and "LATEST" in actions[0] and "damaged" in actions[0] and "step_00000030" in actions[0]
    assert store.read_latest() == 30
    [repair] = [e for e in store.events() if e.event == "repair_latest"]
    assert repair.step == 30 and "damaged" in repair.data["reason"]
    assert not [e for e in store.events() if e.event == "roll_forward"]


def test_a_step_that_never_existed_is_not_found(store):
    commit(store, 10)
    with pytest.raises(CkptError, match="step 7 does not exist") as err:
        store.read_manifest(7)
    assert err.value.exit_code == ExitCode.NOT_FOUND and "10" in err.value.hint
