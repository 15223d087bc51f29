"""The error kinds recovery tells apart by type, each with the exit code users and `ckpt run` read."""

from __future__ import annotations

from ckpt_tool.errors import (
    RESTART_CANNOT_HELP,
    CkptError,
    ConflictError,
    DamageError,
    ExitCode,
    MisfitError,
    NewerFormatError,
    PermissionDeniedError,
    SaveFailedError,
)


def test_each_kind_keeps_its_exit_code_and_stays_a_ckpt_error():
    cases = [
        (DamageError("step 20: hash mismatch in a.distcp"), ExitCode.FAILED),
        (MisfitError("saved at world size 4, this run has 3"), ExitCode.CONFLICT),
        (NewerFormatError("format version 9 is newer than this ckpt-tool reads"), ExitCode.CONFLICT),
        (PermissionDeniedError("cannot read step_20/a.distcp"), ExitCode.USAGE),
    ]
    for exc, code in cases:
        assert isinstance(exc, CkptError) and exc.exit_code == code
    assert isinstance(cases[2][0], MisfitError)  # a newer format is a misfit: nothing moves
    assert all(exc.exit_code in RESTART_CANNOT_HELP for exc, _ in cases[1:])  # `ckpt run` stops on those


def test_damage_is_a_type_not_an_exit_code():
    """A plain CkptError with exit 1 (a command failed, a write failed) is not damage: only the
    raisers of damage say so, by raising DamageError."""
    assert not isinstance(CkptError("`scontrol requeue` failed (exit 1)"), DamageError)
    assert not isinstance(CkptError("torn", exit_code=ExitCode.FAILED), DamageError)
    assert not isinstance(MisfitError("does not fit"), DamageError)
    assert not isinstance(PermissionDeniedError("may not read"), DamageError)
    assert type(DamageError).__name__ == "type"  # a plain subclass, no metaclass deciding by exit code
    assert isinstance(MisfitError("does not fit"), ConflictError) and not isinstance(ConflictError("lock held"), MisfitError)
    assert (ConflictError("lock held").exit_code, SaveFailedError("disk full").exit_code) == (ExitCode.CONFLICT, ExitCode.SAVE_FAILED)
    assert str(DamageError("hash mismatch", "run `ckpt rollback`")) == "hash mismatch (hint: run `ckpt rollback`)"


def test_a_damaged_directory_raises_damage(tmp_path):
    """A manifest that is garbage, one copied from another step, LATEST naming a step without a
    manifest: each raised as DamageError with the path and the next command."""
    import pytest

    from ckpt_tool.core import layout
    from ckpt_tool.store.store import CheckpointStore

    store = CheckpointStore(tmp_path, create=True)
    step_dir = tmp_path / layout.step_dir_name(20)
    step_dir.mkdir()
    (step_dir / layout.MANIFEST_NAME).write_text('{"step": 20, "fil')
    with pytest.raises(DamageError, match=rf"{layout.MANIFEST_NAME}.*damaged") as raised:
        store.read_manifest(20)
    assert "ckpt rollback" in raised.value.hint or "ckpt validate" in raised.value.hint
    (tmp_path / layout.LATEST_NAME).write_text("step_00000030\n")
    with pytest.raises(DamageError, match="LATEST in .* names step 30"):
        store.require_latest()
    result = store.check_files(20)  # damage is a result of the check, not an exception
    assert not result.ok and result.problems[0].file == layout.MANIFEST_NAME


def test_a_lock_held_elsewhere_is_a_conflict_and_a_failed_save_its_own_kind(tmp_path):
    import pytest

    from ckpt_tool.store.store import CheckpointStore
    from ckpt_tool.training.save_failures import SaveFailure, describe

    store = CheckpointStore(tmp_path, create=True)
    with store.changing(), pytest.raises(ConflictError, match="is held by another process"):
        with CheckpointStore(tmp_path).changing(timeout=0.1):
            pass
    failure = SaveFailure(
        step=5, root=tmp_path, error_type="OSError", error_text="EIO", errno=5, filename=None, free=None, needed=None, latest=None
    )
    assert isinstance(describe(failure), SaveFailedError)


def test_the_raisers_raise_the_kind_they_are(tmp_path):
    """A batch that cannot be split on the new mesh, a non-resizable dimension changed, a file this
    user may not read: each raised as its kind, so a caller can catch it by type."""
    import pytest

    from ckpt_tool.core.batch import BatchConfig
    from ckpt_tool.core.mesh import Mesh
    from ckpt_tool.core.reshard_plan import check_mesh_change, plan_batch
    from ckpt_tool.store.store import CheckpointStore

    with pytest.raises(MisfitError, match="global batch 12 cannot be split over 5"):
        plan_batch(BatchConfig(2, 1, 6), 5)
    with pytest.raises(MisfitError, match="changing .* is not supported"):
        check_mesh_change(Mesh.of({"dp_shard": 2, "pp": 2}), Mesh.of({"dp_shard": 2, "pp": 1}))
    denied = CheckpointStore(tmp_path, create=True).permission_denied(tmp_path / "step_00000020" / "__0_0.distcp")
    assert isinstance(denied, PermissionDeniedError) and denied.exit_code == ExitCode.USAGE and "not damage" in denied.message
