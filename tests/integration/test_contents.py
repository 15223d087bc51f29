"""`ckpt inspect`, `ckpt diff`, `ckpt du` and `ckpt quarantine` on real checkpoints of the reference recipe
(2 ranks, FSDP2, steps 5..20). The tensor-parallel case is in test_tensor_parallel."""

from __future__ import annotations

import shutil

import pytest

from ckpt_tool.core import layout
from ckpt_tool.store.store import CheckpointStore

from .test_cli_trust import cli, cli_json, flip_bit, shard, snapshot

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_inspect_names_every_entry_with_its_shape_bytes_and_split(ckpt, capsys):
    code, report, err = cli_json(capsys, "inspect", ckpt, "--step", "15")
    assert code == 0, err
    entries = {e["key"]: e for e in report["entries"]}
    tok = entries["model.tok.weight"]
    assert tok["kind"] == "tensor" and tok["dtype"] == "float32" and tok["placement"] == "dim 0 / 2"  # FSDP: rows split over 2 ranks
    assert tok["bytes"] == tok["shape"][0] * tok["shape"][1] * 4
    assert any(e["kind"] == "object" for e in entries.values())  # the optimizer's hyper-parameters
    m = report["manifest"]
    assert m["step"] == 15 and m["world_size"] == 2 and m["mesh_text"] == "dp_shard 2" and m["env"]["torch"]
    assert report["tensor_bytes"] == sum(e["bytes"] for e in entries.values() if e["bytes"])
    code, text, _ = cli(capsys, "inspect", ckpt)  # a pipe: whole lines, LATEST by default
    assert code == 0 and "step 20 of run" in text and "model.tok.weight\t256x64\tfloat32\t65536\tdim 0 / 2" in text


def test_du_counts_checkpoints_quarantine_and_the_rest(ckpt, capsys):
    assert cli(capsys, "rollback", ckpt, "--to", "15")[0] == 0
    code, report, _ = cli_json(capsys, "du", ckpt)
    assert code == 0
    rows = {r["name"]: r for r in report["entries"]}
    step10 = ckpt / layout.step_dir_name(10)
    assert (
        rows["step_00000010"]["bytes"] == sum(p.stat().st_size for p in step10.iterdir()) and rows["step_00000010"]["kind"] == "checkpoint"
    )
    [q] = [r for r in report["entries"] if r["kind"] == "quarantine"]
    assert q["name"].startswith("quarantine/step_00000020.") and report["totals"]["quarantine"] == q["bytes"] > 0
    assert report["total"] == sum(r["bytes"] for r in report["entries"])


def test_quarantine_restore_round_trip_and_purge_only_on_request(ckpt, capsys):
    store = CheckpointStore(ckpt)
    assert cli(capsys, "rollback", ckpt, "--to", "10")[0] == 0
    code, listed, _ = cli_json(capsys, "quarantine", "list", ckpt)
    assert (
        code == 0 and [r["step"] for r in listed["quarantined"]] == [15, 20] and "rolled back to 10" in listed["quarantined"][0]["reason"]
    )
    before = snapshot(ckpt)
    assert cli(capsys, "quarantine", "restore", ckpt, "20", "--dry-run")[0] == 0 and snapshot(ckpt) == before
    code, restored, err = cli_json(capsys, "quarantine", "restore", ckpt, "20")
    assert code == 0 and restored["valid"] is True, err
    assert store.check_files(20).ok and store.read_latest() == 10  # back, valid, and LATEST left alone
    assert [e.event for e in store.events()][-2:] == ["restored", "validated"]
    code, _, err = cli(capsys, "quarantine", "restore", ckpt, "20")
    assert code == 3 and "no quarantined checkpoint '20'" in err and "step_00000015." in err
    # a restore onto an existing step directory is refused, and moves nothing
    shutil.copytree(ckpt / layout.step_dir_name(10), ckpt / layout.step_dir_name(15))
    before = snapshot(ckpt)
    code, _, err = cli(capsys, "quarantine", "restore", ckpt, "15")
    assert code == 4 and "step_00000015 exists" in err and snapshot(ckpt) == before
    shutil.rmtree(ckpt / layout.step_dir_name(15))
    # a damaged one comes back as asked, said to be damaged (exit 1)
    [q] = list(store.quarantine_root.iterdir())
    flip_bit(q / "__0_0.distcp")
    code, out, _ = cli(capsys, "quarantine", "restore", ckpt, q.name)
    assert code == 1 and "damaged" in out and store.read_latest() == 10
    # purge: a dry run and a too-young cut-off delete nothing; then everything quarantined goes
    assert cli(capsys, "rollback", ckpt, "--to", "20")[0] == 0 and cli(capsys, "rollback", ckpt, "--to", "10")[0] == 0
    before = snapshot(ckpt)
    code, would, _ = cli_json(capsys, "quarantine", "purge", ckpt, "--dry-run")
    assert code == 0 and len(would["would_delete"]) == 2 and snapshot(ckpt) == before
    code, kept, _ = cli_json(capsys, "quarantine", "purge", ckpt, "--older-than", "1")
    assert kept["deleted"] == [] and snapshot(ckpt) == before
    code, gone, _ = cli_json(capsys, "quarantine", "purge", ckpt)
    assert code == 0 and len(gone["deleted"]) == 2 and list(store.quarantine_root.iterdir()) == []
    assert store.events()[-1].event == "quarantine_purged"


def test_history_plot_of_a_checkpoint_directory_and_its_bad_requests(ckpt, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = cli(capsys, "history", ckpt, "--metrics", tmp_path / "m.jsonl")
    assert code == 2 and "--plot" in err
    code, _, err = cli(capsys, "history", ckpt, "--plot", tmp_path / "no" / "p.png")
    assert code == 2 and "is not a directory" in err
    (tmp_path / "m.jsonl").write_text("not json\n")
    code, _, err = cli(capsys, "history", ckpt, "--plot", tmp_path / "p.png", "--metrics", tmp_path / "m.jsonl")
    assert code == 2 and "no JSON lines with a step and a loss" in err and not (tmp_path / "p.png").exists()
    code, _, err = cli(capsys, "history", ckpt, "--plot", tmp_path / "p.png")  # the probe loss at each commit
    assert code == 0 and "picture written to" in err and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_diff_of_two_steps_a_copy_and_a_damaged_copy(ckpt, capsys, tmp_path):
    """Two steps of one run differ (exit 1, the largest difference named); a step and its copy in
    another directory (another path, the same run) are identical (exit 0); a damaged side is
    refused before anything is compared; nothing on disk changes."""
    before = snapshot(ckpt)
    code, text, err = cli(capsys, "diff", ckpt / layout.step_dir_name(15), ckpt / layout.step_dir_name(20))
    assert code == 1, err
    assert "model.tok.weight\tdiffers\t16384/16384\t" in text and "2 of 150 entries identical; 148 differ (largest: model." in text, text
    code, report, _ = cli_json(capsys, "diff", ckpt, ckpt, "--step-a", "15")  # B: LATEST (20)
    assert code == 1 and report["a"]["step"] == 15 and report["b"]["step"] == 20 and not report["identical"]
    assert {e["key"] for e in report["entries"] if e["status"] == "identical"} == {"probe.inputs", "probe.targets"}, report
    assert report["facts_differ"] == [{"fact": "step", "a": 15, "b": 20}]
    other = tmp_path / "copy"
    shutil.copytree(ckpt, other)
    code, text, err = cli(capsys, "diff", ckpt, other)
    assert code == 0 and "identical: all " in text and " entries bit for bit" in text, text + err
    assert "\tidentical\t" not in text  # only what differs is listed, unless --all
    code, text, _ = cli(capsys, "diff", ckpt, other, "--all")
    assert code == 0 and "model.tok.weight\tidentical\t0/16384" in text
    flip_bit(shard(other, 20))
    code, text, err = cli(capsys, "diff", ckpt, other)
    assert code == 1 and "step 20 is damaged" in err and "ckpt list" in err, err
    assert snapshot(ckpt) == before


def test_diff_refuses_what_is_not_a_checkpoint_by_name(ckpt, capsys, tmp_path):
    code, _, err = cli(capsys, "diff", ckpt, tmp_path / "nowhere")
    assert code == 3 and "nowhere" in err, err
    code, _, err = cli(capsys, "diff", ckpt / layout.step_dir_name(15), ckpt, "--step-a", "10")
    assert code == 2 and "is step 15, but --step 10 was given" in err, err
    code, _, err = cli(capsys, "diff", ckpt, ckpt, "--step-b", "7")
    assert code == 3 and "7" in err, err
