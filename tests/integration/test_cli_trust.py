"""The defects a new user found (#11), each on real checkpoints of the reference recipe (steps
5, 10, 15, 20 written by 2 ranks): nothing good is lost, every step is shown, read-only means
read-only, errors say what to do, output fits a pipe."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from ckpt_tool.cli import output
from ckpt_tool.cli.main import main
from ckpt_tool.core import layout
from ckpt_tool.store.store import CheckpointStore

from ..as_nobody import as_nobody, cli_as_nobody
from ..conftest import read_only_view
from .conftest import ckpt_cli

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, " ".join(err.split())


def cli_json(capsys, *args):
    code, out, err = cli(capsys, *args, "--json")
    return code, json.loads(out) if out.strip() else None, err


def shard(ckpt: Path, step: int, name: str = "__0_0.distcp") -> Path:
    return ckpt / layout.step_dir_name(step) / name


def flip_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with a hash of its content: any change shows."""
    found = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        found[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return found


# ------------------------------------------------------------------ never lose a good checkpoint
def test_prune_keeps_the_valid_checkpoints_when_latest_is_known_damaged(ckpt, capsys):
    flip_bit(shard(ckpt, 20))
    code, result, _ = cli_json(capsys, "validate", ckpt)
    assert code == 1 and not result["ok"]  # the index now holds `invalid` for 20
    code, result, err = cli_json(capsys, "prune", ckpt, "--keep-last", "1")
    assert code == 0, err
    assert result["deleted"] == [5, 10]  # not [5, 10, 15]: 20 does not count, 15 is the one kept
    store = CheckpointStore(ckpt)
    assert store.committed_on_disk() == [15, 20] and store.check_files(15).ok


def test_prune_validates_before_deleting_when_nobody_knows_latest_is_damaged(ckpt, capsys):
    flip_bit(shard(ckpt, 20))  # silent damage: no check has run yet
    before = snapshot(ckpt)
    code, result, err = cli_json(capsys, "prune", ckpt, "--keep-last", "1", "--dry-run")
    assert (code, result["would_delete"], result["deleted"], result["dry_run"]) == (0, [5, 10], [], True), err
    assert snapshot(ckpt) == before  # the dry run validated, and wrote nothing, not even the index
    code, result, err = cli_json(capsys, "prune", ckpt, "--keep-last", "1")
    assert result["deleted"] == [5, 10] and "step 20 failed validation" in err
    rows = {r["step"]: r["status"] for r in cli_json(capsys, "list", ckpt)[1]["checkpoints"]}
    assert rows == {15: "validated", 20: "invalid"}


@pytest.mark.parametrize("flag", ["--one-process", "--per-rank"])
def test_reshard_copy_flags_without_out_are_refused(ckpt, capsys, flag):
    before = snapshot(ckpt)
    code, _, err = cli(capsys, "reshard", ckpt, "--world-size", "1", flag)
    assert code == 2 and f"{flag} says how the --out copy is written" in err and "add --out DIR2" in err
    assert snapshot(ckpt) == before


@pytest.mark.parametrize("where", ["source", "inside", "parent", "file", "not-empty"])
def test_reshard_out_refuses_the_source_and_places_it_could_damage(ckpt, capsys, tmp_path, where):
    out = {"source": ckpt, "inside": ckpt / "resharded", "parent": ckpt.parent, "file": tmp_path / "f", "not-empty": tmp_path / "used"}[
        where
    ]
    (tmp_path / "f").write_text("x")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    before = snapshot(ckpt)
    code, _, err = cli(capsys, "reshard", ckpt, "--world-size", "1", "--out", out)
    assert code == 2, err
    assert {"source": "overlaps", "inside": "overlaps", "parent": "overlaps", "file": "is a file", "not-empty": "not empty"}[where] in err
    assert "--ckpt-dir" not in err  # no hint at an option that does not exist
    assert snapshot(ckpt) == before and (tmp_path / "used" / "notes.txt").read_text() == "mine"


def test_a_torn_index_line_is_reported_and_the_next_event_starts_a_new_line(ckpt, capsys):
    with open(ckpt / layout.INDEX_NAME, "a") as f:
        f.write('{"event": "validated", "st')  # a crash mid-append
    assert cli_json(capsys, "validate", ckpt, "--step", "15")[0] == 0
    last = json.loads((ckpt / layout.INDEX_NAME).read_text().splitlines()[-1])
    assert (last["event"], last["step"], last["ok"]) == ("validated", 15, True)  # not glued onto the torn line
    code, listing, _ = cli_json(capsys, "list", ckpt)
    assert {r["step"]: r["status"] for r in listing["checkpoints"]}[15] == "validated"
    assert any("1 line(s) are not readable events" in n for n in listing["notes"])
    assert "not readable events" in cli(capsys, "list", ckpt)[2]


# ------------------------------------------------------------------ show every checkpoint
def test_list_shows_a_damaged_latest_and_where_latest_points(ckpt, capsys):
    (ckpt / layout.step_dir_name(20) / layout.MANIFEST_NAME).unlink()
    code, listing, _ = cli_json(capsys, "list", ckpt)
    assert code == 0 and listing["latest"] == 20 and "no manifest" in listing["latest_problem"]
    rows = {r["step"]: (r["status"], r["latest"]) for r in listing["checkpoints"]}
    assert rows == {5: ("committed", False), 10: ("committed", False), 15: ("committed", False), 20: ("damaged", True)}
    code, out, err = cli(capsys, "list", ckpt)
    assert "damaged" in out and "LATEST" in err and "rollback" in err
    shutil.rmtree(ckpt / layout.step_dir_name(20))
    rows = {r["step"]: (r["status"], r["latest"]) for r in cli_json(capsys, "list", ckpt)[1]["checkpoints"]}
    assert rows[20] == ("missing", True)
    assert "not a committed checkpoint" in cli(capsys, "list", ckpt, "--latest")[2]


def make_plain_dcp(path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(path), no_dist=True)
    return path


@pytest.mark.parametrize(
    "what, code, message",
    [
        ("file", 2, "is a file, not a checkpoint directory"),
        ("empty", 3, "is empty"),
        ("step", 2, "is a single checkpoint"),
        ("dcp", 2, "is a plain DCP checkpoint"),
        ("other", 2, "is not a checkpoint directory: it holds notes.txt"),
    ],
)
def test_commands_say_what_they_found_instead_of_an_empty_table(ckpt, capsys, tmp_path, what, code, message):
    target = {
        "file": ckpt / layout.LATEST_NAME,
        "empty": tmp_path / "empty",
        "step": ckpt / layout.step_dir_name(5),
        "dcp": tmp_path / "dcp",
        "other": tmp_path / "other",
    }[what]
    (tmp_path / "empty").mkdir()
    make_plain_dcp(tmp_path / "dcp")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    before = snapshot(tmp_path)
    for command in (("list",), ("validate", "--step", "5"), ("rollback", "--auto"), ("prune", "--keep-last", "1")):
        got, out, err = cli(capsys, command[0], target, *command[1:])
        assert (got, out) == (code, ""), err
        assert message in err and "Traceback" not in err
    assert snapshot(tmp_path) == before  # no index.jsonl or .lock created in a directory that is not ours


# ------------------------------------------------------------------ read-only means read-only
@pytest.fixture
def read_only_copy(ckpt, tmp_path):
    with read_only_view(ckpt, tmp_path / "ro") as ro:
        yield ro


def test_checks_work_on_a_read_only_directory_and_change_nothing(read_only_copy, capsys):
    before = snapshot(read_only_copy)
    assert cli_json(capsys, "list", read_only_copy)[0] == 0
    code, result, err = cli_json(capsys, "validate", read_only_copy, "--all")
    assert code == 0 and result["ok"], err
    assert any("not recorded" in n and "Read-only" in n for n in result["notes"])
    code, report, err = cli_json(capsys, "verify", read_only_copy, "--step", "20")
    assert code == 0 and report["ok"] and report["notes"], err
    code, report, err = cli_json(capsys, "rollback", read_only_copy, "--auto", "--dry-run")
    assert code == 0 and report["target"] == 20, err
    code, result, err = cli_json(capsys, "prune", read_only_copy, "--keep-last", "1", "--dry-run")
    assert code == 0 and result["would_delete"] == [5, 10, 15], err
    code, out, err = cli(capsys, "validate", read_only_copy)
    assert code == 0 and "step 20: valid" in out and "note:" in err and "Traceback" not in err
    for change in (("prune", "--keep-last", "1"), ("rollback", "--to", "15"), ("reshard", "--world-size", "1", "--in-place")):
        code, _, err = cli(capsys, change[0], read_only_copy, *change[1:])
        assert code == 2 and "cannot change" in err and "Read-only" in err and "Traceback" not in err, (change, err)
    assert snapshot(read_only_copy) == before


def test_ckpt_nodes_on_a_read_only_run_directory_says_it_cannot_record_its_decision(tmp_path, capsys):
    """Leaving a node behind is a decision the next ones read back: unrecorded, it is refused in
    words (the cause, the path, where to look instead), not a traceback; nothing changes."""
    src = tmp_path / "src"
    (src / "run").mkdir(parents=True)
    crash = {"event": "rank_exited", "node": "n2", "round": "r", "cause": "crashed", "rank": 1, "local_rank": 0, "reason": "CUDA error"}
    peer = {"event": "rank_exited", "node": "n1", "round": "r", "cause": "peer_failure", "rank": 0, "local_rank": 0}
    events = [{"event": "start", "node": n, "round": "r", "attempt": 0, "time": 0.0} for n in ("n1", "n2")]
    events += [{**e, "attempt": a, "time": 1.0 + a} for a in range(2) for e in (crash, peer)]
    (src / "run" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with read_only_view(src, tmp_path / "ro") as ro:
        before = snapshot(ro)
        code, out, err = cli(capsys, "nodes", ro, "--nodes", "n1,n2,n3", "--train-nodes", "2", "--after-failure")
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert "cannot record the decision (replace: replacing n2 with n3" in err and "Read-only file system" in err, err
        assert f"ckpt status {ro / 'run'}" in " ".join(err.split()), err
        assert snapshot(ro) == before


def test_dry_runs_change_nothing_on_disk(ckpt, capsys):
    before = snapshot(ckpt)
    for args in (
        ("rollback", "--auto", "--dry-run"),
        ("rollback", "--dry-run"),
        ("rollback", "--to", "5", "--dry-run"),
        ("prune", "--keep-last", "1", "--dry-run"),
        ("reshard", "--world-size", "1", "--dry-run"),
    ):
        code, _, err = cli(capsys, args[0], ckpt, *args[1:])
        assert code == 0, (args, err)
        assert snapshot(ckpt) == before, args


@pytest.fixture
def shard_nobody_cannot_read(ckpt):
    """The checkpoint where user nobody can reach it, readable except one shard of step 20."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    base = Path(tempfile.mkdtemp(prefix="ckpt-perm-", dir="/tmp"))
    os.chmod(base, 0o755)
    target = base / "ckpt"
    shutil.copytree(ckpt, target)
    for p in [target, *target.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chmod(shard(target, 20), 0o600)  # root's: nobody may not read it
    yield target
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("args", [("validate",), ("validate", "--all"), ("rollback", "--auto", "--dry-run"), ("prune", "--keep-last", "1")])
def test_a_shard_this_user_cannot_read_is_not_damage(shard_nobody_cannot_read, args):
    target = shard_nobody_cannot_read
    before = snapshot(target)
    code, text = cli_as_nobody([args[0], str(target), *args[1:]], target)
    text = " ".join(text.split())
    assert code == 2, text
    assert "permission denied" in text and "not damage" in text and "__0_0.distcp" in text
    assert "rollback" not in text.split("hint:")[-1] and "Traceback" not in text
    assert snapshot(target) == before  # nothing quarantined, nothing recorded as invalid


def test_a_run_directory_this_user_cannot_read_is_a_clear_error(shard_nobody_cannot_read, tmp_path):
    target = shard_nobody_cannot_read
    (target / "run").mkdir(exist_ok=True)
    (target / "run" / "events.jsonl").write_text('{"event": "start", "time": 1.0}\n')
    os.chmod(target / "run" / "events.jsonl", 0o600)  # root's
    for command in ("history", "status"):
        code, text = cli_as_nobody([command, str(target)], target)
        assert code == 2 and "permission denied reading" in text and "Traceback" not in text, text


def test_resume_with_a_shard_it_cannot_read_refuses_and_quarantines_nothing(tmp_path):
    """The training counterpart: not damage, so no quarantine and no fallback to an older step."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    from ..integration.tiny import make_trainer

    base = Path(tempfile.mkdtemp(prefix="ckpt-perm-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        t = make_trainer(base / "c", save_every=1)
        for step in (1, 2):
            t.step()
            t.manager.maybe_save(step)
        t.manager.close()
        (base / "c" / layout.OWNER_NAME).unlink()  # that job ended (its pid, this test's, lives on)
        nobody = __import__("pwd").getpwnam("nobody")
        for p in [base / "c", *(base / "c").rglob("*")]:
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        private = next((base / "c" / layout.step_dir_name(2)).glob("*.distcp"))
        os.chown(private, 0, 0)
        os.chmod(private, 0o600)
        shutil.copytree(base / "c", base / "warm")  # for the imports, as root

        def resume(directory: Path) -> None:
            from ckpt_tool.errors import CkptError

            t2 = make_trainer(directory)
            try:
                t2.manager.resume()
            except CkptError as exc:
                print(exc.message)
                raise SystemExit(exc.exit_code) from None

        steps_before = {p.name: snapshot(p) for p in (base / "c").glob("step_*")}
        code, text = as_nobody(lambda: resume(base / "c"), warm_up=lambda: resume(base / "warm"))
        assert code == 2, text
        assert "permission denied" in text and "not damage" in text
        store = CheckpointStore(base / "c")
        assert store.read_latest() == 2 and not store.quarantine_root.exists()
        assert not [e for e in store.events() if e.event in ("quarantine", "rollback", "repair_latest")]
        assert {p.name: snapshot(p) for p in (base / "c").glob("step_*")} == steps_before
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ errors a person can act on
def test_square_brackets_in_paths_are_shown_as_typed(ckpt, capsys, tmp_path, monkeypatch):
    odd = tmp_path / "exp[lr=3e-4]"
    shutil.copytree(ckpt, odd)
    monkeypatch.setattr(output.out, "_force_terminal", True)  # the Rich table, as on a terminal
    code, out, _ = cli(capsys, "list", odd)
    assert code == 0 and "exp[lr=3e-4]" in " ".join(out.split())
    monkeypatch.setattr(output.out, "_force_terminal", False)
    code, out, _ = cli(capsys, "rollback", odd, "--dry-run")
    assert code == 0 and f"{odd}/quarantine" in out
    code, _, err = cli(capsys, "list", odd / "nothing[1]")
    assert code == 3 and "exp[lr=3e-4]/nothing[1] does not exist" in err


def test_a_garbage_latest_is_named_by_rollback_and_repaired_once_by_recover(ckpt, capsys, tmp_path):
    (ckpt / layout.LATEST_NAME).write_bytes(b"\x00not a pointer")
    code, out, _ = cli(capsys, "rollback", ckpt, "--auto", "--dry-run")
    text = " ".join(out.split())
    assert code == 0 and "LATEST:" in text and "damaged" in text and "would point LATEST at step 20" in text and "None" not in text
    code, decision, _ = cli_json(capsys, "recover", ckpt, "--run-dir", tmp_path / "run")
    assert code == 0 and decision["step"] == 20
    [action] = decision["cleanup"]
    assert "damaged" in action and "step_00000020" in action
    events = [e.event for e in CheckpointStore(ckpt).events()]
    assert events.count("repair_latest") == 1 and "roll_forward" not in events


def test_verify_says_which_options_reproduce_the_save(ckpt, capsys):
    code, out, _ = cli(capsys, "verify", ckpt, "--step", "20")
    text = " ".join(out.split())
    assert code == 0 and "--nproc 2" in text and "reshard" not in text
    if torch.get_num_threads() != 1:
        assert "OMP_NUM_THREADS=1" in text


def test_errors_inside_torchrun_keep_their_exit_code_and_message(ckpt, capsys, tmp_path):
    code, _, err = cli(capsys, "verify", ckpt, "--nproc", "2", "--entry", "json:dumps")
    assert code == 2 and "failed when called as dumps(world_size=2" in err and "under torchrun failed" not in err
    flip_bit(shard(ckpt, 20))
    code, _, err = cli(capsys, "reshard", ckpt, "--world-size", "1", "--out", tmp_path / "r", "--per-rank")
    assert code == 1 and "does not match the manifest" in err
    assert not (tmp_path / "r" / layout.LATEST_NAME).exists()


def test_status_and_history_of_a_file_are_clear_errors(ckpt, capsys):
    for command in ("status", "history"):
        code, _, err = cli(capsys, command, ckpt / layout.LATEST_NAME)
        assert code == 2 and "is a file" in err and "Traceback" not in err


def test_human_output_has_no_python_reprs(ckpt, capsys):
    assert cli(capsys, "prune", ckpt, "--keep-last", "3")[0] == 0
    code, out, _ = cli(capsys, "history", ckpt)
    assert code == 0 and "retention: keep the last 3; step 20 passed validation" in out
    assert "RetentionPolicy(" not in out and "=None" not in out
    code, out, _ = cli(capsys, "reshard", ckpt, "--world-size", "1", "--dry-run")
    assert "data position (global, unchanged): epoch 0, position 320" in out and "{" not in out


# ------------------------------------------------------------------ output that fits a pipe
def test_piped_list_gives_whole_lines_grep_can_count(ckpt):
    proc = ckpt_cli("list", ckpt, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split("\t")[:3] == ["step", "status", "latest"]
    assert len(lines) == 5 and all(len(line.split("\t")) == 10 for line in lines)
    assert sum("committed" in line for line in lines) == 4  # `ckpt list DIR | grep -c committed`
    assert "…" not in proc.stdout and "┃" not in proc.stdout
    assert lines[-1].split("\t")[-1] == "step_00000020"
    proc = ckpt_cli("validate", ckpt, "--all", timeout=120)
    assert proc.returncode == 0 and proc.stdout.count(": valid (") == 4


def test_ckpt_stacks_on_a_read_only_run_directory_says_it_cannot_ask(tmp_path, capsys):
    """`ckpt stacks` asks the watchdogs through a file in the run directory: where it cannot
    write, it says so and where to run it instead; nothing changes. Not a running job: exit 3."""
    src = tmp_path / "src"
    (src / "run").mkdir(parents=True)
    (src / "run" / "events.jsonl").write_text(json.dumps({"event": "start", "node": "n1", "round": "r", "attempt": 0, "time": 0.0}) + "\n")
    code, out, err = cli(capsys, "stacks", src / "run", "--wait", "1")
    assert code == 3 and "no rank answered in 1 s" in err and f"ckpt status {src / 'run'}" in " ".join(err.split()), err
    assert not [p for p in (src / "run" / "hangs").iterdir() if p.is_dir()]  # the unanswered request leaves no directory
    with read_only_view(src, tmp_path / "ro") as ro:
        before = snapshot(ro)
        code, out, err = cli(capsys, "stacks", ro / "run", "--wait", "1")
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert f"cannot write the request for stacks into {ro / 'run'}: Read-only file system" in " ".join(err.split()), err
        assert "run ckpt stacks as the job's user" in " ".join(err.split()), err
        assert snapshot(ro) == before
