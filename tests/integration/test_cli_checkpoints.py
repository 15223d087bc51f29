"""ckpt list / validate / verify / rollback / prune on real checkpoints of the reference recipe.

One 2-rank run writes steps 5, 10, 15, 20; each fault test damages a copy in a known way and
checks that validate and/or verify name the problem, that ``rollback --auto`` lands on the
newest good checkpoint, and that nothing good is deleted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tool.cli.main import main
from ckpt_tool.core import layout
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.store.checksums import hash_files
from ckpt_tool.store.store import CheckpointStore

from ..conftest import Recipe

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

STEPS = (5, 10, 15, 20)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    recipe = Recipe(tmp_path_factory.mktemp("cli"), steps=20, save_every=5, extra=("--keep-last", "4"))
    assert recipe.run() == 0, recipe.log.read_text()[-3000:]
    return recipe.ckpt_dir


@pytest.fixture
def ckpt(source, tmp_path) -> Path:
    dest = tmp_path / "ckpt"
    shutil.copytree(source, dest)
    return dest


def ckpt_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([*map(str, args)])
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def ckpt_json(capsys, *args: str):
    code, out, err = ckpt_cli(capsys, *args, "--json")
    return code, json.loads(out)


def shard(ckpt: Path, step: int, name: str = "__0_0.distcp") -> Path:
    return ckpt / layout.step_dir_name(step) / name


def assert_good_steps_intact(ckpt: Path, steps) -> None:
    store = CheckpointStore(ckpt)
    for step in steps:
        assert store.check_files(step).ok, f"good step {step} was damaged or removed"


# ---------------------------------------------------------------- healthy directory
def test_list_json_and_latest(ckpt, capsys):
    code, listing = ckpt_json(capsys, "list", ckpt)
    rows = listing["checkpoints"]
    assert code == 0 and listing["latest"] == 20 and listing["latest_problem"] is None
    assert [r["step"] for r in rows] == list(STEPS)
    assert [r["latest"] for r in rows] == [False, False, False, True]
    for r in rows:
        assert r["status"] == "committed" and r["world_size"] == 2 and r["global_batch"] == 16
        assert r["bytes"] > 0 and Path(r["path"]).is_dir() and r["probe_loss"] > 0
    code, out, _ = ckpt_cli(capsys, "list", ckpt, "--latest")
    assert (code, out.strip()) == (0, "20")


def test_validate_all_then_verify_updates_status(ckpt, capsys):
    code, results = ckpt_json(capsys, "validate", ckpt, "--all")
    assert code == 0 and results["ok"] and [r["ok"] for r in results["steps"]] == [True] * 4
    code, report = ckpt_json(capsys, "verify", ckpt)
    assert code == 0 and report["ok"] and report["step"] == 20
    assert [c["name"] for c in report["checks"]] == ["step", "loss", "lr", "grad_norm"]
    assert not report["exact"]  # one process checking a 2-rank checkpoint: tolerance applies
    assert "--nproc 2" in report["reproduce"]  # what makes it exact: the saved world size
    rows = ckpt_json(capsys, "list", ckpt)[1]["checkpoints"]
    assert [r["status"] for r in rows] == ["validated", "validated", "validated", "verified"]
    assert all(r["last_validated"] for r in rows)


def test_verify_under_torchrun_at_the_saved_world_size_is_bit_exact(ckpt, capsys):
    code, report = ckpt_json(capsys, "verify", ckpt, "--step", "15", "--nproc", "2")
    assert code == 0 and report["ok"] and report["exact"]
    assert all(c["how"] == "exact" for c in report["checks"])


def test_prune_dry_run_then_real(ckpt, capsys):
    code, result = ckpt_json(capsys, "prune", ckpt, "--keep-last", "2", "--dry-run")
    assert (code, result["would_delete"]) == (0, [5, 10])
    assert CheckpointStore(ckpt).committed_on_disk() == list(STEPS)
    code, result = ckpt_json(capsys, "prune", ckpt, "--keep-last", "1", "--keep-every", "10")
    assert result["deleted"] == [5, 15]
    assert CheckpointStore(ckpt).committed_on_disk() == [10, 20]


def test_manual_rollback_and_to(ckpt, capsys):
    code, report = ckpt_json(capsys, "rollback", ckpt, "--dry-run")
    assert (code, report["target"], report["would_quarantine"], report["quarantined"], report["dry_run"]) == (0, 15, [20], [], True)
    assert CheckpointStore(ckpt).read_latest() == 20
    code, report = ckpt_json(capsys, "rollback", ckpt, "--to", "10", "--reason", "loss spike")
    assert (report["target"], report["quarantined"]) == (10, [15, 20])
    store = CheckpointStore(ckpt)
    assert store.read_latest() == 10 and store.committed_on_disk() == [5, 10]
    assert len(list(store.quarantine_root.iterdir())) == 2
    assert any(e.event == "rollback" and e.data["reason"] == "loss spike" for e in store.events())


# ---------------------------------------------------------------- faults
def flip_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def swap_in_from_step_15(ckpt: Path) -> None:
    shutil.copy(shard(ckpt, 15), shard(ckpt, 20))


def tamper_parameters_and_rehash(ckpt: Path) -> None:
    """An edit to the weights with every hash recomputed: only verification can notice."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    d = ckpt / layout.step_dir_name(20)
    state = _load_state_dict_from_keys(checkpoint_id=str(d))
    w = state["model"]["tok.weight"]
    w += 0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0))  # (a constant shift: LayerNorm hides it)
    for f in d.iterdir():
        if f.name.endswith(".distcp") or f.name == ".metadata":
            f.unlink()
    dcp.save(state, checkpoint_id=str(d), no_dist=True)
    m = Manifest.from_json((d / layout.MANIFEST_NAME).read_text())
    names = sorted(f.name for f in d.iterdir() if f.name != layout.MANIFEST_NAME)
    files = tuple(FileEntry(h.name, h.bytes, h.hash, layout.rank_of_file(h.name) or 0) for h in hash_files(d, names, m.run_id, 20))
    (d / layout.MANIFEST_NAME).write_text(Manifest(**{**m.__dict__, "files": files}).to_json())


WITH_MANIFEST, WITHOUT_MANIFEST = [20, 15], [15]  # steps rollback --auto tries: a step without a manifest is no candidate
FAULTS = {
    # name: (damage, what validate says about step 20 (None: validate passes), steps rollback --auto tries)
    "bit-flip": (lambda c: flip_bit(shard(c, 20)), ("__0_0.distcp", "content hash differs"), WITH_MANIFEST),
    "truncated": (lambda c: shard(c, 20).write_bytes(shard(c, 20).read_bytes()[:-100]), ("__0_0.distcp", "size differs"), WITH_MANIFEST),
    "deleted": (lambda c: shard(c, 20, "__1_0.distcp").unlink(), ("__1_0.distcp", "missing file"), WITH_MANIFEST),
    "metadata-damaged": (lambda c: flip_bit(shard(c, 20, ".metadata")), (".metadata", "content hash differs"), WITH_MANIFEST),
    "manifest-garbage": (
        lambda c: shard(c, 20, layout.MANIFEST_NAME).write_text("{garbage"),
        (layout.MANIFEST_NAME, "unreadable manifest"),
        WITH_MANIFEST,
    ),
    "manifest-missing": (
        lambda c: shard(c, 20, layout.MANIFEST_NAME).unlink(),
        (layout.MANIFEST_NAME, "unreadable manifest"),
        WITHOUT_MANIFEST,
    ),
    "swapped-from-step-15": (
        swap_in_from_step_15,
        ("__0_0.distcp", "content hash differs (damaged, or copied from another step"),
        WITH_MANIFEST,
    ),
    "params-tampered-rehashed": (tamper_parameters_and_rehash, None, WITH_MANIFEST),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_reported_and_rollback_auto_lands_on_newest_good(ckpt, capsys, fault):
    damage, expected, tried = FAULTS[fault]
    damage(ckpt)
    code, results = ckpt_json(capsys, "validate", ckpt, "--step", "20")
    if expected is None:
        assert code == 0 and results["steps"][0]["ok"]  # hashes match: validation cannot see this
        code, report = ckpt_json(capsys, "verify", ckpt, "--step", "20")
        assert code == 1 and not report["ok"]
        failed = {c["name"] for c in report["checks"] if not c["ok"]}
        assert {"loss", "grad_norm"} <= failed and "step" not in failed
    else:
        assert code == 1
        problems = results["steps"][0]["problems"]
        assert any(p["file"] == expected[0] and p["what"].startswith(expected[1]) for p in problems), problems
    code, report = ckpt_json(capsys, "rollback", ckpt, "--auto")
    assert code == 0 and report["target"] == 15 and report["quarantined"] == [20]
    assert [a["step"] for a in report["attempts"]] == tried
    store = CheckpointStore(ckpt)
    assert store.read_latest() == 15
    assert_good_steps_intact(ckpt, STEPS[:3])
    assert [p.name.split(".")[0] for p in store.quarantine_root.iterdir()] == ["step_00000020"]


def test_latest_naming_a_missing_step(ckpt, capsys):
    (ckpt / "LATEST").write_text(layout.format_pointer(99))
    code, _, err = ckpt_cli(capsys, "validate", ckpt)
    assert code == 1
    code, report = ckpt_json(capsys, "rollback", ckpt, "--auto")
    assert (code, report["target"], report["quarantined"]) == (0, 20, [])
    assert CheckpointStore(ckpt).read_latest() == 20
    assert_good_steps_intact(ckpt, STEPS)


def test_latest_holding_garbage(ckpt, capsys):
    (ckpt / "LATEST").write_bytes(b"\x00\xffnot a pointer")
    code, _, err = ckpt_cli(capsys, "list", ckpt, "--latest")
    assert code == 1 and "LATEST" in err and f"rollback {ckpt} --auto" in " ".join(err.split())  # the repair command, runnable as printed
    code, report = ckpt_json(capsys, "rollback", ckpt, "--auto")
    assert (code, report["target"], report["previous_latest"]) == (0, 20, None)
    assert "damaged" in report["latest_problem"]
    assert CheckpointStore(ckpt).read_latest() == 20
    assert_good_steps_intact(ckpt, STEPS)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "args, code, message",
    [
        (("list", "/nonexistent/ckpts"), 3, "does not exist"),
        (("validate", "{ckpt}", "--step", "-1"), 2, ""),
        (("validate", "{ckpt}", "--step", "999999999999"), 2, "less than or equal to 99999999"),
        (("status", "99999999"), 3, "SLURM knows no job 99999999"),
        (("validate", "{ckpt}", "--step", "7"), 3, "step 7 does not exist"),
        (("verify", "{ckpt}", "--step", "7"), 3, "step 7 does not exist"),
        (("reshard", "{ckpt}", "--world-size", "1", "--step", "7"), 3, "step 7 does not exist"),
        (("validate", "{ckpt}", "--step", "5", "--all"), 2, "exclude each other"),
        (("rollback", "{ckpt}", "--to", "7"), 3, "step 7 does not exist"),
        (("rollback", "{ckpt}", "--to", "5", "--auto"), 2, "exclude each other"),
        (("verify", "{ckpt}", "--entry", "no_such_module_xyz:build"), 2, "does not import"),
        (("verify", "{ckpt}", "--entry", "json:dumps"), 2, "failed when called as dumps(world_size=1"),
        (("verify", "{ckpt}", "--entry", "builtins:dict"), 2, "not (model, loss_fn)"),
        (("verify", "{ckpt}", "--entry", "nocolon"), 2, "module:function"),
        (("prune", "{ckpt}", "--keep-last", "0"), 2, ""),
        (("prune", "{ckpt}"), 2, "--keep-last"),  # deleting has no default
    ],
)
def test_bad_input_gives_a_clear_error_and_changes_nothing(ckpt, capsys, args, code, message):
    before = sorted(p.name for p in ckpt.iterdir())
    got, out, err = ckpt_cli(capsys, *(a.format(ckpt=ckpt) for a in args))
    assert got == code, err
    assert message in err
    assert "Traceback" not in err
    assert sorted(p.name for p in ckpt.iterdir()) == before
    assert_good_steps_intact(ckpt, STEPS)


def test_training_resume_verifies_and_rolls_back_by_itself(ckpt, tmp_path):
    """The in-process counterpart: the manager re-measures the probe after loading, finds the
    tampered step 20, quarantines it and resumes from 15, with no human in the loop."""
    tamper_parameters_and_rehash(ckpt)
    recipe = Recipe(tmp_path / "resume", steps=25, save_every=5, extra=("--keep-last", "4"), ckpt_dir=ckpt)
    assert recipe.run() == 0, recipe.log.read_text()[-3000:]
    store = CheckpointStore(ckpt)
    [q] = [e for e in store.events() if e.event == "quarantine"]
    assert q.step == 20 and "verify loss" in q.data["reason"]
    assert [m.step for m in recipe.metrics_lines()] == list(range(16, 26))
    assert store.read_latest() == 25 and store.check_files(25).ok


def test_recover_decides_resume_rollback_and_reshard(ckpt, capsys, tmp_path):
    run_dir = tmp_path / "run"
    code, out, _ = ckpt_cli(capsys, "recover", ckpt, "--world-size", "2", "--run-dir", run_dir, "--json")
    decision = json.loads(out)
    assert (code, decision["action"], decision["step"], decision["reshard"], decision["hashes_checked"]) == (0, "resume", 20, None, False)
    # A flipped bit keeps every size: the structure check at the start does not read the data, the
    # ranks' load-time hash check finds it (tests/slurm: every rank falls back together)...
    flip_bit(shard(ckpt, 20))
    code, out, _ = ckpt_cli(capsys, "recover", ckpt, "--world-size", "2", "--json")
    assert (code, json.loads(out)["step"], json.loads(out)["rolled_back_from"]) == (0, 20, None)
    # ...and --full hashes every file here, as before
    code, out, _ = ckpt_cli(capsys, "recover", ckpt, "--world-size", "1", "--run-dir", run_dir, "--json", "--full")
    decision = json.loads(out)
    assert (decision["step"], decision["rolled_back_from"], decision["quarantined"], decision["hashes_checked"]) == (15, 20, [20], True)
    assert decision["reshard"]["new"] == {"micro_batch": 8, "grad_accum": 2, "dp_size": 1, "global_batch": 16}
    assert json.loads((run_dir / "recover.json").read_text()) == decision
    assert [e for e in (run_dir / "events.jsonl").read_text().splitlines() if '"recover"' in e]
    # a file cut short is structure: found without --full
    path = shard(ckpt, 15)
    path.write_bytes(path.read_bytes()[:-100])
    code, out, _ = ckpt_cli(capsys, "recover", ckpt, "--world-size", "2")
    assert code == 0 and "rolled back from 15 to step 10" in " ".join(out.split()), out
    assert "structure checked in" in out and "the ranks hash the files as they load" in " ".join(out.split())
    code, _, err = ckpt_cli(capsys, "recover", ckpt, "--world-size", "3")
    assert code == 4 and "cannot be split over 3" in err


def test_recover_decides_without_torch_and_hashes_the_dcp_metadata(ckpt, tmp_path):
    """The decision at every start imports no torch (seconds per restart on a loaded node) unless
    the world size changed (the shape check reads the DCP metadata); the metadata's bytes are
    checked by hash, so a flipped bit there is found without reading the data."""
    import subprocess
    import sys

    code = (
        "import json, sys; from pathlib import Path; from ckpt_tool.ops.recover import recover; "
        "d = recover(Path(sys.argv[1]), int(sys.argv[2])); print(json.dumps([d.step, d.rolled_back_from, 'torch' in sys.modules]))"
    )

    def decide(world_size: int) -> list:
        proc = subprocess.run([sys.executable, "-c", code, str(ckpt), str(world_size)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    assert decide(2) == [20, None, False]
    assert decide(1)[2] is True  # another world size: the reshard check reads shapes with torch
    flip_bit(shard(ckpt, 20, layout.DCP_METADATA_NAME))
    assert decide(2)[:2] == [15, 20]  # (the rollback then checks its target in full, torch included)
    assert CheckpointStore(ckpt).read_latest() == 15


def test_recover_on_a_fresh_directory_starts_fresh(tmp_path, capsys):
    code, out, _ = ckpt_cli(capsys, "recover", tmp_path / "new", "--world-size", "2", "--json")
    assert code == 0 and json.loads(out)["action"] == "fresh"
    (tmp_path / "empty").mkdir()
    code, out, _ = ckpt_cli(capsys, "recover", tmp_path / "empty", "--world-size", "2")
    assert code == 0 and "fresh start" in out and list((tmp_path / "empty").iterdir()) == []


def test_scrubbing_finds_bit_rot_in_an_old_checkpoint(ckpt, capsys):
    flip_bit(shard(ckpt, 5, "__1_0.distcp"))  # silent corruption long after the save
    code, results = ckpt_json(capsys, "validate", ckpt, "--all")
    assert code == 1
    assert [r["step"] for r in results["steps"] if not r["ok"]] == [5]
    rows = ckpt_json(capsys, "list", ckpt)[1]["checkpoints"]
    status = {r["step"]: (r["status"], r["last_validated"] is not None) for r in rows}
    assert status == {5: ("invalid", True), 10: ("validated", True), 15: ("validated", True), 20: ("validated", True)}


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "--timeout", "step=abc", "--", "train.py"), "not PHASE=SECONDS"),
        (("run", "--timeout", "nap=3", "--", "train.py"), "not PHASE=SECONDS"),
        (("reshard", "{ckpt}", "--world-size", "0"), ""),
        (("plan", "--ckpt-seconds", "abc", "--mtbf-hours", "3"), ""),
        (("submit", "--ckpt-dir", "{ckpt}", "--time", "soon", "--dry-run", "--", "train.py"), "not a SLURM time"),
        (("submit", "--ckpt-dir", "{ckpt}", "--job-name", "a;b", "--dry-run", "--", "train.py"), "characters SLURM would misread"),
    ],
)
def test_bad_arguments_exit_2_without_traceback(ckpt, capsys, args, message):
    code, out, err = ckpt_cli(capsys, *(a.format(ckpt=ckpt) for a in args))
    assert code == 2, err
    assert message in " ".join(err.split()) and "Traceback" not in err
