"""The fast tier's pure rules (core.local_tier) and its wire format (training.local_wire)."""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest
import xxhash

from ckpt_tool.core import layout
from ckpt_tool.core import local_tier as rules
from ckpt_tool.core.manifest import FileEntry, Manifest
from ckpt_tool.errors import CkptError
from ckpt_tool.store.checksums import binding_seed
from ckpt_tool.training import local_wire


def test_names_round_trip():
    assert rules.parse_rank_dir_name(rules.rank_dir_name(37)) == 37
    assert [rules.parse_rank_dir_name(n) for n in ("rank_1", "rank_0000x", "step_00000001", "rank_000001")] == [None] * 4
    assert rules.step_path(PurePath("/l"), 3, 12) == PurePath("/l/rank_00003/step_00000012")


def test_default_root_is_the_jobs_tmpfs_or_the_runs_own():
    assert rules.default_root({"SLURM_JOB_ID": "77"}, "ann", "/ck") == "/dev/shm/ckpt-ann-77"
    a, b = rules.default_root({}, "ann", "/ck/a"), rules.default_root({}, "ann", "/ck/b")
    assert a.startswith("/dev/shm/ckpt-ann-") and a != b


@pytest.mark.parametrize(
    "nodes, replicas, expected",
    [
        (["a", "a", "b", "b"], 1, ((2,), (3,), (0,), (1,))),  # same position on the next node
        (["a", "b", "c"], 2, ((1, 2), (2, 0), (0, 1))),
        (["a", "b"], 3, ((1,), (0,))),  # as many copies as there are other nodes
        (["a", "a"], 1, ((), ())),  # one node: no peer
        (["a", "a", "b"], 1, ((2,), (2,), (0,))),  # a smaller node wraps around
        (["a", "b"], 0, ((), ())),
    ],
)
def test_peers_are_on_other_nodes(nodes, replicas, expected):
    got = rules.peers(nodes, replicas)
    assert got == expected
    for rank, kept_by in enumerate(got):
        assert all(nodes[p] != nodes[rank] for p in kept_by)
    assert rules.sources(got, 2) == tuple(r for r, k in enumerate(got) if 2 in k)


def test_any_single_node_loss_leaves_a_full_copy():
    nodes = [n for n in "abcd" for _ in range(4)]
    peer_map = rules.peers(nodes, 1)
    for lost in "abcd":
        survivors = {r for r, n in enumerate(nodes) if n != lost}
        assert all(r in survivors or set(peer_map[r]) & survivors for r in range(len(nodes)))


NODES = ["a", "b"]


def test_choose_takes_the_newest_step_complete_across_ranks_and_newer_than_shared():
    held = [[(0, 12), (1, 12), (0, 14)], [(1, 14)]]  # rank 1's step 14 is complete; rank 0's copy on b is missing
    choice = rules.choose(held, NODES, newer_than=10)
    assert choice == rules.LocalChoice(14, (0, 1))
    assert rules.choose(held, NODES, newer_than=14) is None
    assert rules.choose([[(0, 14)], []], NODES, None) is None  # rank 1's files nowhere


def test_choose_fetches_only_across_nodes():
    # node a (ranks 0, 1) lost its own copies; b holds them. Rank 1's copy is also on a (checked by rank 0).
    held = [[(1, 14)], [], [(0, 14), (2, 14)], [(1, 14), (3, 14)]]
    choice = rules.choose(held, ["a", "a", "b", "b"], None)
    assert choice is not None and choice.holders == (2, 0, 2, 3)
    assert choice.fetches(["a", "a", "b", "b"]) == ((2, 0),)


def test_checker_shares_a_nodes_directories_out_once():
    nodes = ["a", "a", "a", "b"]
    for rank_dir in range(8):
        assert sum(rules.checker(rank_dir, me, nodes) for me in (0, 1, 2)) == 1
        assert rules.checker(rank_dir, 3, nodes)


@pytest.mark.parametrize(
    "steps, keep, shared, dropped",
    [
        ([2, 4, 6], 2, None, (2,)),
        ([2, 4, 6], 2, 4, (2, 4)),  # not newer than the shared checkpoint: of no use
        ([2, 4, 6], 2, 6, (2, 4, 6)),
        ([6], 1, None, ()),
    ],
)
def test_steps_to_drop(steps, keep, shared, dropped):
    assert rules.steps_to_drop(steps, keep, shared) == dropped


def test_room_needed_counts_own_ranks_and_kept_copies():
    nodes = ["a", "a", "b", "b"]
    peer_map = rules.peers(nodes, 1)
    need = rules.room_needed([100, 200, 400, 800], nodes, peer_map, "a")
    assert need == int(rules.SPACE_MARGIN * (100 + 200 + 400 + 800))
    assert rules.room_needed([100, 200], ["a", "a"], rules.peers(["a", "a"], 1), "a") == int(rules.SPACE_MARGIN * 300)


# --------------------------------------------------------------------------- the wire format
def make_copy(directory: Path, rank: int = 1, step: int = 14) -> Path:
    files = {".metadata": b"meta", "__0_0.distcp": bytes(range(256)) * 10, layout.rank_state_name(rank): b'{"step": 14}'}
    run_id = "r1"
    entries = tuple(
        FileEntry(n, len(b), xxhash.xxh3_128_hexdigest(b, seed=binding_seed(run_id, step, n)), rank) for n, b in sorted(files.items())
    )
    path = directory / rules.rank_dir_name(rank) / layout.step_dir_name(step)
    path.mkdir(parents=True)
    for name, blob in files.items():
        (path / name).write_bytes(blob)
    (path / layout.MANIFEST_NAME).write_text(Manifest(run_id, step, 0.0, 2, entries).to_json())
    return path


def test_a_copy_round_trips_and_is_kept_beside_then_renamed(tmp_path):
    src = make_copy(tmp_path / "a")
    rank, step = local_wire.keep(tmp_path / "b", local_wire.encode(src, 1, 14))
    kept = tmp_path / "b" / "rank_00001" / "step_00000014"
    assert (rank, step) == (1, 14)
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == {p.name: p.read_bytes() for p in src.iterdir()}
    assert not list((tmp_path / "b" / "rank_00001").glob(".*partial"))


def test_a_copy_that_does_not_match_its_manifest_is_refused_and_leaves_nothing(tmp_path):
    data = local_wire.encode(make_copy(tmp_path / "a"), 1, 14)
    data[-5] ^= 0x01  # a bit flipped on the way (or on the sender's disk)
    with pytest.raises(CkptError, match="does not match its manifest"):
        local_wire.keep(tmp_path / "b", data)
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.distcp"))


@pytest.mark.parametrize(
    "garble",
    [
        lambda d: bytearray(8),  # what a holder sends when it cannot read its copy
        lambda d: d[:6],  # cut inside the length
        lambda d: d[:40],  # cut inside the header
        lambda d: d[:-10],  # a file runs past the end
        lambda d: bytearray(b"\xff" * 8) + d[8:],  # a length larger than the buffer
        lambda d: d.replace(b"__0_0.distcp", b"../../x.dist"),  # a path out of the directory (same length)
    ],
)
def test_a_garbled_copy_is_a_clear_error(tmp_path, garble):
    data = local_wire.encode(make_copy(tmp_path / "a"), 1, 14)
    with pytest.raises(CkptError, match="garbled|does not match"):
        local_wire.keep(tmp_path / "b", garble(bytearray(data)))
    assert not (tmp_path / "x.dist").exists()
