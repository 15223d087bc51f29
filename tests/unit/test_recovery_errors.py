"""The error kinds recovery tells apart by type, each with the exit code users and `ckpt run` read."""

from __future__ import annotations

from ckpt_tool.errors import (
    RESTART_CANNOT_HELP,
    CkptError,
    DamageError,
    ExitCode,
    MisfitError,
    NewerFormatError,
    PermissionDeniedError,
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


def test_damage_is_told_apart_by_type_including_the_plain_errors_raised_with_exit_1():
    assert isinstance(CkptError("manifest.json is damaged"), DamageError)  # exit 1 by default
    assert isinstance(CkptError("torn", exit_code=ExitCode.FAILED), DamageError)
    assert not isinstance(CkptError("does not fit", exit_code=ExitCode.CONFLICT), DamageError)
    assert not isinstance(CkptError("may not read", exit_code=ExitCode.USAGE), DamageError)
    assert not isinstance(MisfitError("does not fit"), DamageError)
    assert not isinstance(PermissionDeniedError("may not read"), DamageError)
    assert str(DamageError("hash mismatch", "run `ckpt rollback`")) == "hash mismatch (hint: run `ckpt rollback`)"


def test_the_raisers_raise_the_kind_they_are(tmp_path):
    """A batch that cannot be split on the new mesh, a non-resizable dimension changed, a file this
    user may not read: each raised as its kind, so a caller can catch it by type."""
    import pytest

    from ckpt_tool.core.batch import BatchConfig
    from ckpt_tool.core.mesh import Mesh
    from ckpt_tool.core.reshard import check_mesh_change, plan_batch
    from ckpt_tool.store.store import CheckpointStore

    with pytest.raises(MisfitError, match="global batch 12 cannot be split over 5"):
        plan_batch(BatchConfig(2, 1, 6), 5)
    with pytest.raises(MisfitError, match="changing .* is not supported"):
        check_mesh_change(Mesh.of({"dp_shard": 2, "pp": 2}), Mesh.of({"dp_shard": 2, "pp": 1}))
    denied = CheckpointStore(tmp_path, create=True).permission_denied(tmp_path / "step_00000020" / "__0_0.distcp")
    assert isinstance(denied, PermissionDeniedError) and denied.exit_code == ExitCode.USAGE and "not damage" in denied.message
