"""The streaming verified reader (training/verified_reader.py): one hashed pass per file, straight
into the targets; damage refused by name; the files stay DCP's own (one process, no torchrun)."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckpt_tool.core.manifest import FileEntry
from ckpt_tool.core.tensor_record import parse_tensor_pickle
from ckpt_tool.errors import CkptError
from ckpt_tool.training.hashing_fs import HashingFileSystem
from ckpt_tool.training.safe_dcp import SafeLoadPlanner, load_state
from ckpt_tool.training.verified_reader import StreamingVerifiedReader


def seed(name: str) -> int:
    return len(name) * 7919


def source_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(37, 19, generator=g),  # rows that straddle every small chunk size
        "half": torch.randn(8, 3, generator=g).to(torch.bfloat16),
        "ids": torch.arange(11, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "flag": torch.tensor([True, False, True]),
        "transposed": torch.randn(5, 6, generator=g).t(),  # saved with its strides: torch's own path
        "hyper": {"lr": 0.1, "betas": [0.9, 0.95]},  # bytes: torch's own path, after the hash check
    }


def save(tmp_path: Path) -> tuple[Path, dict[str, FileEntry]]:
    path = tmp_path / "ckpt"
    fs = HashingFileSystem(seed)
    writer = FileSystemWriter(path, single_file_per_rank=True, thread_count=2)
    writer.fs = fs
    dcp.save(source_state(), storage_writer=writer, no_dist=True)
    entries = {name: FileEntry(name, d.bytes, d.hash, 0) for name, d in fs.written.items()}
    return path, entries


def empty_like(state: dict, wide: bool = False) -> dict:
    """Targets to load into; ``wide``: ``w`` in float64 (converted as it is copied: not read in place)."""
    out = {}
    for k, v in state.items():
        out[k] = torch.full_like(v, 7) if isinstance(v, torch.Tensor) else {"lr": 0.0, "betas": [0.0, 0.0]}
    if wide:
        out["w"] = out["w"].double()
    return out


def load(path: Path, entries: dict[str, FileEntry], chunk_bytes: int = 8 << 20, threads: int = 2, wide: bool = False) -> dict:
    state = empty_like(source_state(), wide)
    reader = StreamingVerifiedReader(path, HashingFileSystem(seed, entries), threads=threads, chunk_bytes=chunk_bytes)
    dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return state


def assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("wide", [False, True], ids=["in-place", "converted"])
@pytest.mark.parametrize("chunk_bytes", [8 << 20, 4096, 77, 7])
def test_every_entry_arrives_intact_whatever_the_chunk_size(tmp_path, chunk_bytes, wide):
    path, entries = save(tmp_path)
    loaded, expected = load(path, entries, chunk_bytes, wide=wide), source_state()
    if wide:
        assert loaded["w"].dtype == torch.float64
        loaded["w"] = loaded["w"].float()
    assert_equal(loaded, expected)


def test_plain_tensors_stream_and_the_rest_takes_torchs_path(tmp_path, monkeypatch):
    import ckpt_tool.training.verified_reader as vr

    kinds: dict[str, str] = {}
    original = vr.StreamingVerifiedReader._sink

    def spy(self, fd, req, resolve, seen):
        sink = original(self, fd, req, resolve, seen)
        kinds[req.storage_index.fqn] = type(sink).__name__
        return sink

    monkeypatch.setattr(vr.StreamingVerifiedReader, "_sink", spy)
    path, entries = save(tmp_path)
    load(path, entries)
    # read straight into the destination's memory; an empty tensor has nothing to read
    assert {k for k, v in kinds.items() if v == "_Direct"} == {"w", "half", "ids", "scalar", "flag"}
    assert kinds["transposed"] == "_Buffered" and kinds["hyper.lr"] == "_Buffered"
    load(path, entries, wide=True)
    assert kinds["w"] == "_Tensor"  # another dtype: streamed through the buffer and converted


def data_offset(path: Path, fqn: str) -> tuple[Path, int]:
    """The file holding ``fqn`` and where its raw bytes start in it (found the way torch's zip lays them out)."""
    from ckpt_tool.training.safe_dcp import load_metadata_safely

    with open(path / ".metadata", "rb") as f:
        metadata = load_metadata_safely(f)
    [info] = [v for k, v in metadata.storage_data.items() if k.fqn == fqn]
    blob = (path / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
    z = zipfile.ZipFile(io.BytesIO(blob))
    member = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    local = blob[member.header_offset : member.header_offset + 30]
    names = int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    return path / info.relative_path, info.offset + member.header_offset + 30 + names


@pytest.mark.parametrize("where", ["tensor data", "zip header"])
def test_a_flipped_byte_is_refused_by_name(tmp_path, where):
    path, entries = save(tmp_path)
    data_file, start = data_offset(path, "w")
    offset = start + 100 if where == "tensor data" else start - 40
    raw = bytearray(data_file.read_bytes())
    raw[offset] ^= 0x10
    data_file.write_bytes(bytes(raw))
    with pytest.raises(CkptError) as err:
        load_state(empty_like(source_state()), path, no_dist=True, verify_with=HashingFileSystem(seed, entries))
    assert str(data_file) in err.value.message and "does not match the manifest" in err.value.message


def test_a_truncated_file_is_refused_before_it_is_read(tmp_path):
    path, entries = save(tmp_path)
    data_file, _ = data_offset(path, "w")
    data_file.write_bytes(data_file.read_bytes()[:-10])
    with pytest.raises(CkptError, match="not read: the size differs"):
        load_state(empty_like(source_state()), path, no_dist=True, verify_with=HashingFileSystem(seed, entries))


def test_the_files_stay_readable_by_torchs_own_tools(tmp_path):
    path, entries = save(tmp_path)
    ours = load(path, entries)
    theirs = empty_like(source_state())
    dcp.load(theirs, checkpoint_id=path, no_dist=True)
    assert_equal(theirs, ours)
    dcp_to_torch_save(path, tmp_path / "whole.pt")
    assert_equal(torch.load(tmp_path / "whole.pt", weights_only=True), ours)


def test_a_hostile_or_unusual_record_is_not_parsed():
    class Boom:
        def __reduce__(self):
            return (print, ("pwned",))

    assert parse_tensor_pickle(pickle.dumps(Boom())) is None
    assert parse_tensor_pickle(b"garbage") is None
    buf = io.BytesIO()
    torch.save(torch.arange(6.0).reshape(2, 3)[:, 1:], buf)  # a view into a larger storage
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    record = parse_tensor_pickle(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))
    assert record is not None and not record.row_major  # streamed only when its bytes are the tensor, in order
