"""The checkpoint commands' trust fixes (#30), each on real checkpoints of the reference recipe
(steps 5, 10, 15, 20 written by 2 ranks), run as a user runs them: the installed ``ckpt`` in a
process of its own, from a working directory outside the source tree."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tool.core import layout

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

CKPT = Path(sys.executable).with_name("ckpt")  # the console script: sys.path[0] is its bin directory, not the cwd


def ckpt_in(cwd: Path, *args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """`ckpt ARGS` run from ``cwd`` (outside the source tree), output as a pipe sees it."""
    return subprocess.run([str(CKPT), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def said(proc: subprocess.CompletedProcess) -> str:
    """stdout and stderr, whitespace folded (Rich may wrap a long line)."""
    return " ".join((proc.stdout + proc.stderr).split())


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with a hash of its content: any change shows."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


@pytest.fixture
def away(tmp_path) -> Path:
    """A working directory that is not the source tree."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd


# ------------------------------------------------------------------ 1. one range check for --step
@pytest.mark.parametrize("command", ["export", "inspect", "validate", "verify", "reshard"])
@pytest.mark.parametrize("step", ["-1", "100000000"])
def test_every_step_option_refuses_a_step_out_of_range_without_a_traceback(ckpt, away, command, step):
    extra = ("--world-size", "1") if command == "reshard" else ()
    before = snapshot(ckpt)
    proc = ckpt_in(away, command, ckpt, "--step", step, *extra)
    assert proc.returncode == 2, said(proc)
    assert "Traceback" not in said(proc) and "ValueError" not in said(proc), said(proc)
    assert "--step" in said(proc) and ("99999999" in said(proc) or "0" in said(proc)), said(proc)
    assert snapshot(ckpt) == before
    assert not list(away.iterdir())  # no export file begun


def test_adopt_refuses_a_step_out_of_range(ckpt, away, tmp_path):
    proc = ckpt_in(away, "adopt", ckpt / layout.step_dir_name(20), tmp_path / "new", "--step", "100000000")
    assert proc.returncode == 2 and "--step" in said(proc) and "Traceback" not in said(proc), said(proc)
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ 2. output paths that are directories or files
@pytest.mark.parametrize("force", [(), ("--force",)])
def test_export_out_that_is_a_directory_is_refused_and_left_alone(ckpt, away, force):
    target = away / "weights"
    (target / "keep").mkdir(parents=True)
    proc = ckpt_in(away, "export", ckpt, "--out", target, *force)
    assert proc.returncode == 2, said(proc)
    assert "IsADirectoryError" not in said(proc) and "Traceback" not in said(proc), said(proc)
    assert f"--out {target} is a directory" in said(proc) and "give a file name" in said(proc), said(proc)
    assert sorted(p.name for p in target.iterdir()) == ["keep"]


def test_adopt_into_an_existing_file_is_refused_and_the_file_kept(ckpt, away):
    existing = away / "notes.txt"
    existing.write_text("mine\n")
    proc = ckpt_in(away, "adopt", ckpt / layout.step_dir_name(20), existing)
    assert proc.returncode == 2, said(proc)
    assert "NotADirectoryError" not in said(proc) and "Traceback" not in said(proc), said(proc)
    assert f"{existing} is a file, not a directory" in said(proc) and "new (or empty) directory" in said(proc), said(proc)
    assert existing.read_text() == "mine\n" and sorted(p.name for p in away.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------------ 3. verify checks structure before loading
def test_verify_of_a_truncated_shard_names_the_file_and_both_sizes(ckpt, away):
    shard = ckpt / layout.step_dir_name(20) / "__1_0.distcp"
    full = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(full // 3)
    proc = ckpt_in(away, "verify", ckpt)
    assert proc.returncode == 1, said(proc)
    text = said(proc)
    assert "EOFError" not in text and "Traceback" not in text, text
    assert "__1_0.distcp" in text and f"{full} bytes" in text and f"{full // 3} bytes" in text, text
    assert "not loaded" in text and f"ckpt validate {ckpt} --step 20" in text and "ckpt rollback" in text, text


# ------------------------------------------------------------------ 4. nothing to verify; --entry from the working directory
@pytest.fixture(scope="module")
def no_probe_checkpoints(tmp_path_factory) -> Path:
    """A healthy checkpoint of the second recipe saved without a probe (one process, 4 steps)."""
    root = tmp_path_factory.mktemp("no-probe")
    cmd = [sys.executable, "-m", "ckpt_tool.recipes.tiny_cnn", "--ckpt-dir", root / "ckpt", "--steps", "4", "--save-every", "4"]
    proc = subprocess.run([*map(str, cmd), "--metrics", str(root / "m.jsonl"), "--no-probe"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "ckpt"


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_verify_without_a_probe_says_there_is_nothing_to_verify_with_its_own_exit_code(no_probe_checkpoints, away, nproc):
    proc = ckpt_in(away, "verify", no_probe_checkpoints, "--nproc", nproc)
    assert proc.returncode == 5, said(proc)  # ExitCode.NOTHING_TO_VERIFY: not 1 (damage)
    text = said(proc)
    assert "saved without a probe" in text and "nothing to verify" in text and "--entry" not in text, text
    assert f"ckpt validate {no_probe_checkpoints} --step 4" in text, text
    assert ckpt_in(away, "validate", no_probe_checkpoints).returncode == 0  # and it is healthy


def test_verify_without_a_probe_or_entry_point_does_not_ask_for_one(no_probe_checkpoints, away, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(no_probe_checkpoints, copy)
    manifest = copy / layout.step_dir_name(4) / layout.MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["entry_point"] = None
    manifest.write_text(json.dumps(data))
    proc = ckpt_in(away, "verify", copy)
    assert proc.returncode == 5 and "saved without a probe" in said(proc) and "--entry" not in said(proc), said(proc)


def test_verify_entry_finds_a_module_in_the_working_directory(ckpt, away):
    (away / "mymodel.py").write_text("from ckpt_tool.recipes.tiny_gpt import build_for_verify as build\n")
    proc = ckpt_in(away, "verify", ckpt, "--entry", "mymodel:build", "--json")
    assert proc.returncode == 0, said(proc)
    assert json.loads(proc.stdout)["ok"] is True


def flip_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))


# ------------------------------------------------------------------ 5. LATEST deleted while committed checkpoints exist
@pytest.mark.parametrize("args", [("list", "--latest"), ("validate",), ("inspect",), ("export",), ("verify",)])
def test_a_missing_latest_is_named_with_the_repair_command_everywhere(ckpt, away, args):
    (ckpt / layout.LATEST_NAME).unlink()
    proc = ckpt_in(away, args[0], ckpt, *args[1:])
    text = said(proc)
    assert proc.returncode == 1, text
    assert f"LATEST is missing in {ckpt}, which holds committed checkpoints (steps 5, 10, 15, 20)" in text, text
    assert f"ckpt rollback {ckpt} --auto" in text and "no committed checkpoint yet" not in text, text
    assert not list(away.iterdir())


def test_the_repair_command_for_a_missing_latest_repairs_it(ckpt, away):
    (ckpt / layout.LATEST_NAME).unlink()
    assert ckpt_in(away, "rollback", ckpt, "--auto").returncode == 0
    proc = ckpt_in(away, "list", ckpt, "--latest")
    assert proc.returncode == 0 and proc.stdout.strip() == "20", said(proc)


# ------------------------------------------------------------------ 6. prune says that LATEST is known invalid
def test_prune_says_latest_is_recorded_invalid_and_not_counted(ckpt, away):
    flip_bit(ckpt / layout.step_dir_name(20) / "__0_0.distcp")
    assert ckpt_in(away, "validate", ckpt).returncode == 1  # the index now holds `invalid` for 20
    proc = ckpt_in(away, "prune", ckpt, "--keep-last", "1")
    text = said(proc)
    assert proc.returncode == 0, text
    assert "deleted steps 5, 10" in text, text
    assert "recorded invalid: step 20 (LATEST): kept, and not counted by --keep-last 1" in text, text
    assert f"ckpt rollback {ckpt} --auto" in text, text


# ------------------------------------------------------------------ 7. the hint after a restore is true
def test_restoring_a_damaged_step_does_not_suggest_a_rollback_that_refuses(ckpt, away):
    assert ckpt_in(away, "rollback", ckpt, "--to", "15").returncode == 0  # 20 goes to quarantine
    (moved,) = (ckpt / layout.QUARANTINE_NAME).iterdir()
    flip_bit(moved / "__0_0.distcp")
    proc = ckpt_in(away, "quarantine", "restore", ckpt, "20")
    text = said(proc)
    assert proc.returncode == 1 and "damaged" in text, text
    assert "makes it" not in text and "cannot become LATEST" in text and f"ckpt validate {ckpt} --step 20" in text, text
    assert ckpt_in(away, "rollback", ckpt, "--to", "20").returncode != 0  # what the old hint suggested refuses


@pytest.mark.parametrize("older", [False, True])
def test_restoring_a_valid_step_suggests_the_rollback_that_works(ckpt, away, older):
    assert ckpt_in(away, "rollback", ckpt, "--to", "10").returncode == 0  # 15 and 20 go to quarantine
    step = 15 if older else 20
    if older:  # LATEST back to 20: the restored 15 is older than LATEST
        assert ckpt_in(away, "quarantine", "restore", ckpt, "20").returncode == 0
        assert ckpt_in(away, "rollback", ckpt, "--to", "20").returncode == 0
    proc = ckpt_in(away, "quarantine", "restore", ckpt, str(step))
    text = said(proc)
    assert proc.returncode == 0 and "(valid)" in text, text
    assert f"ckpt rollback {ckpt} --to {step}` makes it LATEST" in text, text
    assert ("moves the newer steps into quarantine" in text) is older, text
    assert ckpt_in(away, "rollback", ckpt, "--to", str(step)).returncode == 0


# ------------------------------------------------------------------ 8. Rich markup never eats a path
def test_export_prints_a_path_with_square_brackets_as_typed(ckpt, away):
    weird = away / "x[bold]y[lr=3e-4]"
    weird.mkdir()
    proc = ckpt_in(away, "export", ckpt, "--out", weird / "w.safetensors", "--model-only")
    assert proc.returncode == 0, said(proc)
    assert f"to {weird / 'w.safetensors'} (safetensors)" in said(proc), said(proc)


# ------------------------------------------------------------------ 9. list and du label what they count
def test_list_and_du_say_what_their_sizes_count(ckpt, away):
    listing = json.loads(ckpt_in(away, "list", ckpt, "--json").stdout)
    data = {r["step"]: r["bytes"] for r in listing["checkpoints"]}
    du = {r["name"]: r["bytes"] for r in json.loads(ckpt_in(away, "du", ckpt, "--json").stdout)["entries"]}
    step_dir = ckpt / layout.step_dir_name(20)
    manifest_bytes = (step_dir / layout.MANIFEST_NAME).stat().st_size
    assert du[step_dir.name] == data[20] + manifest_bytes  # the difference is the manifest, and nothing else
    list_help, du_help = said(ckpt_in(away, "list", "--help")), said(ckpt_in(away, "du", "--help"))
    assert "data size counts the files the manifest lists" in list_help and "`ckpt du` counts every byte on disk" in list_help
    assert "every file, its manifest too" in du_help


# ------------------------------------------------------------------ 10. cosmetics
def test_help_shows_no_bool_values_and_no_lowercase_placeholders(away):
    for command in (["list"], ["validate"], ["export"], ["prune"], ["reshard"], ["quarantine", "restore"], ["adopt"]):
        text = said(ckpt_in(away, *command, "--help"))
        assert "{directory}" not in text and "{which}" not in text and "{source}" not in text, (command, text)
        flags = text.replace("--help <bool>", "")  # typer's own --help
        assert "<bool>" not in flags, (command, text)


def test_inspect_shows_no_none_for_objects(ckpt, away):
    proc = ckpt_in(away, "inspect", ckpt)
    rows = [line.split("\t") for line in proc.stdout.splitlines() if "\tobject\t" in line]
    assert rows and all(r[3] == "-" for r in rows), proc.stdout  # bytes of a non-tensor entry
    assert "None" not in proc.stdout, proc.stdout


def test_rollback_says_step_for_one_step_and_reshard_rank_for_one_rank(ckpt, away, tmp_path):
    proc = ckpt_in(away, "rollback", ckpt, "--to", "15")
    assert "quarantined step 20 into" in said(proc) and "steps 20" not in said(proc), said(proc)
    proc = ckpt_in(away, "reshard", ckpt, "--world-size", "1", "--out", tmp_path / "one")
    assert proc.returncode == 0, said(proc)
    assert "laid out for 1 rank " in said(proc) and "1 ranks" not in said(proc), said(proc)
