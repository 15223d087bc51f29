import json

import pytest

from ckpt_tool.core.batch import BatchConfig
from ckpt_tool.core.manifest import FORMAT_VERSION, FileEntry, Manifest, Probe
from ckpt_tool.core.mesh import Mesh
from ckpt_tool.errors import CkptError, DamageError, ExitCode, NewerFormatError


def make_manifest(**kw) -> Manifest:
    base = {
        "run_id": "abc",
        "step": 40,
        "created_at": 1.5,
        "world_size": 2,
        "files": (FileEntry(".metadata", 10, "00" * 16, 0), FileEntry("__1_0.distcp", 2**40, "ff" * 16, 1)),
        "batch": BatchConfig(4, 3, 2),
        "mesh": Mesh.of({"tp": 2}, must_divide={"tp": {"attention heads": 4}}),
        "env": {"torch": "2.13.0", "threads": 1},
        "probe": Probe(3.25, 0.5, 1e-3, 40),
        "entry_point": "pkg.mod:build",
    }
    base.update(kw)
    return Manifest(**base)


def test_round_trip_is_exact():
    m = make_manifest()
    assert Manifest.from_json(m.to_json()) == m
    assert json.loads(m.to_json())["batch"]["global_batch"] == 24
    assert m.total_bytes == 10 + 2**40


def test_minimal_manifest_round_trips():
    m = make_manifest(batch=None, probe=None, entry_point=None, mesh=None, env={})
    assert Manifest.from_json(m.to_json()) == m
    assert m.layout == Mesh.data_parallel(2)  # no mesh recorded: 1-D FSDP over the world


def test_manifests_from_before_meshes_read_their_parallelism():
    data = json.loads(make_manifest(mesh=None).to_json())
    del data["mesh"]
    data["parallelism"] = {"tp": 2, "dp_shard": 1}
    assert Manifest.from_json(json.dumps(data)).layout.dims == (("dp_shard", 1), ("tp", 2))


def test_a_mesh_of_a_newer_kind_is_not_damage():
    """An unknown dimension (a newer writer) is refused as a conflict (exit 4: upgrade), never as
    damage (exit 1), which would send a good checkpoint to quarantine."""
    data = json.loads(make_manifest().to_json())
    data["mesh"]["dims"] = [["ep", 2]]
    with pytest.raises(CkptError) as err:
        Manifest.from_json(json.dumps(data))
    assert err.value.exit_code == ExitCode.CONFLICT and "unknown mesh dimension 'ep'" in err.value.message
    assert "upgrade" in err.value.hint and isinstance(err.value, NewerFormatError) and not isinstance(err.value, DamageError)


def mutate(**changes):
    data = json.loads(make_manifest().to_json())
    for key, value in changes.items():
        data[key] = value
    return json.dumps(data)


def mutate_file(index, **changes):
    data = json.loads(make_manifest().to_json())
    data["files"][index].update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be an object"),
        (mutate(step="40"), "'step' must be an integer"),
        (mutate(step=-1), "'step' must be an integer"),
        (mutate(world_size=0), "world_size"),
        (mutate(files={}), "'files' must be a list"),
        (mutate(hash_algo="md5"), "unknown hash algorithm"),
        (mutate_file(1, path="../../etc/passwd"), "unsafe or invalid file name"),
        (mutate_file(1, path="/etc/passwd"), "unsafe or invalid file name"),
        (mutate_file(1, path="sub/dir"), "unsafe or invalid file name"),
        (mutate_file(1, path=".."), "unsafe or invalid file name"),
        (mutate_file(1, path="ckpt_manifest.json"), "unsafe or invalid file name"),
        (mutate_file(1, path=7), "unsafe or invalid file name"),
        (mutate_file(1, bytes=2**60), "files[1].bytes"),
        (mutate_file(1, bytes=-5), "files[1].bytes"),
        (mutate_file(1, rank=2), "files[1].rank"),
        (mutate_file(0, path="__1_0.distcp"), "listed twice"),
        (mutate(probe={"loss": "x", "grad_norm": 1, "lr": 1, "step": 1}), "probe.loss"),
        (mutate(batch={"micro_batch": 0, "grad_accum": 1, "dp_size": 1}), "batch.micro_batch"),
        (mutate(mesh={"dims": [["dp_shard", 2], ["tp", 2]]}), "has 4 ranks, but world_size is 2"),
        (mutate(mesh={"dims": [["tp", 0]]}), "mesh dimension 'tp' must be an integer"),
        (mutate(mesh={"dims": [["tp", 2], ["tp", 1]]}), "appears twice"),
        (mutate(mesh={"dims": "tp=2"}), "field 'mesh' must be an object"),
        (mutate(mesh={"dims": [["tp", 2]], "must_divide": {"tp": {"heads": "4"}}}), "mesh limit 'heads'"),
    ],
)
def test_damaged_or_hostile_manifests_are_refused_precisely(text, message):
    with pytest.raises(CkptError) as err:
        Manifest.from_json(text, where="M")
    assert message in err.value.message
    assert err.value.message.startswith("M ")
    assert err.value.hint


def test_missing_field_is_named():
    data = json.loads(make_manifest().to_json())
    del data["run_id"]
    with pytest.raises(CkptError, match="misses the field 'run_id'"):
        Manifest.from_json(json.dumps(data))


def test_unknown_format_version_is_a_conflict_with_upgrade_hint():
    with pytest.raises(CkptError) as err:
        Manifest.from_json(mutate(format_version=FORMAT_VERSION + 1))
    assert err.value.exit_code == ExitCode.CONFLICT and isinstance(err.value, NewerFormatError)
    assert "format version 2" in err.value.message and "upgrade" in err.value.hint
