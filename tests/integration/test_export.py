"""`ckpt export` on real checkpoints of the reference recipe (2 ranks, FSDP2, steps 5..20):
bit-identical to torch's dcp_to_torch_save, refuses damaged and hostile checkpoints without
leaving a file, memory bounded by the largest tensor (a checkpoint larger than the bound)."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import Manifest
from ckpt_tool.store.checksums import binding_seed, hash_file

from .test_cli_trust import cli, cli_json, flip_bit, shard

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the test extra installs safetensors")


def flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def reference(ckpt: Path, step: int, tmp_path: Path) -> dict[str, torch.Tensor]:
    dcp_to_torch_save(ckpt / layout.step_dir_name(step), tmp_path / "ref.pt")
    return {k: v for k, v in flat(torch.load(tmp_path / "ref.pt", weights_only=True)).items() if isinstance(v, torch.Tensor)}


def test_export_matches_dcp_to_torch_save_bit_for_bit_in_both_formats(ckpt, capsys, tmp_path):
    ref = reference(ckpt, 15, tmp_path)
    code, report, err = cli_json(capsys, "export", ckpt, "--step", "15", "--out", tmp_path / "w.safetensors")
    assert code == 0, err
    got = safetensors_torch.load_file(tmp_path / "w.safetensors")
    model = {k.removeprefix("model."): v for k, v in ref.items() if k.startswith("model.")}
    assert set(got) == set(model) | {k for k in ref if k.startswith("optim.")}  # model names as the model has them; no probe batch
    assert all(torch.equal(got[k], model.get(k, ref.get(k))) and got[k].dtype == model.get(k, ref.get(k)).dtype for k in got)
    assert report["tensors"] == len(got) and report["not_exported"]  # the optimizer's hyper-parameters
    code, _, err = cli(capsys, "export", ckpt, "--step", "15", "--format", "torch", "--model-only", "--out", tmp_path / "m.pt")
    assert code == 0, err
    assert zipfile.ZipFile(tmp_path / "m.pt").testzip() is None  # CRCs right: any zip reader takes it
    weights = torch.load(tmp_path / "m.pt", weights_only=True)
    assert set(weights) == set(model) and all(torch.equal(weights[k], model[k]) for k in model)


def test_export_refuses_a_damaged_step_and_leaves_no_file(ckpt, capsys, tmp_path):
    flip_bit(shard(ckpt, 20))
    code, _, err = cli(capsys, "export", ckpt, "--out", tmp_path / "x.safetensors")
    assert code == 1 and "step 20 is damaged" in err and "export another step" in err
    assert list(tmp_path.glob("*x.safetensors*")) == []
    code, _, err = cli(capsys, "export", ckpt, "--step", "10", "--out", tmp_path / "x.safetensors")
    assert code == 0, err


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (shutil.copy, (__file__, self.marker))


def rehash(step_dir: Path, name: str) -> None:
    """An attacker who can write the files can fix the manifest's hash too."""
    m = Manifest.from_json((step_dir / layout.MANIFEST_NAME).read_text())
    digest = hash_file(step_dir / name, binding_seed(m.run_id, m.step, name))
    files = tuple(f if f.path != name else f.__class__(name, digest.bytes, digest.hash, f.rank) for f in m.files)
    (step_dir / layout.MANIFEST_NAME).write_text(Manifest(**{**m.__dict__, "files": files}).to_json())


def test_export_runs_no_pickle_of_a_hostile_checkpoint_and_refuses_lying_metadata(ckpt, capsys, tmp_path):
    step_dir = ckpt / layout.step_dir_name(20)
    good = (step_dir / ".metadata").read_bytes()
    (step_dir / ".metadata").write_bytes(pickle.dumps(Payload(str(tmp_path / "pwned"))))
    rehash(step_dir, ".metadata")
    code, _, err = cli(capsys, "export", ckpt, "--out", tmp_path / "x.safetensors")
    assert code != 0 and not (tmp_path / "pwned").exists() and not (tmp_path / "x.safetensors").exists()
    # metadata that claims a tensor far larger than the files: refused before anything is allocated
    from ckpt_tool.training.safe_dcp import load_metadata_safely

    (step_dir / ".metadata").write_bytes(good)
    with open(step_dir / ".metadata", "rb") as f:
        md = load_metadata_safely(f)
    key = next(k for k in md.state_dict_metadata if k.startswith("model."))
    md.state_dict_metadata[key].size = torch.Size([1 << 20, 1 << 20])
    (step_dir / ".metadata").write_bytes(pickle.dumps(md))
    rehash(step_dir, ".metadata")
    code, _, err = cli(capsys, "export", ckpt, "--out", tmp_path / "x.safetensors")
    assert code == 1 and "describes" in err and "bytes of tensors but its files hold" in err
    assert not (tmp_path / "x.safetensors").exists()


def test_bad_requests_are_clear_errors(ckpt, capsys, tmp_path):
    (tmp_path / "there.pt").write_text("keep me")
    code, _, err = cli(capsys, "export", ckpt, "--format", "torch", "--out", tmp_path / "there.pt")
    assert code == 2 and "exists" in err and "--force" in err and (tmp_path / "there.pt").read_text() == "keep me"
    code, _, err = cli(capsys, "export", ckpt, "--format", "onnx", "--out", tmp_path / "o")
    assert code == 2 and "unknown format" in err
    code, _, err = cli(capsys, "export", ckpt, "--step", "7", "--out", tmp_path / "o")
    assert code == 3
    code, _, err = cli(capsys, "export", ckpt, "--out", tmp_path / "nodir" / "o.safetensors")
    assert code == 2 and "is not a directory" in err


MEMORY_PROBE = """
import json, sys
from pathlib import Path
from ckpt_tool.ops.export import export_checkpoint, return_freed_memory
from ckpt_tool.store.store import CheckpointStore
import torch  # imported before the baseline: the export's memory for data is measured, not code
from torch._subclasses import fake_tensor  # noqa: F401 - what --format torch imports (~70 MB of code)
def rss(field):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field))
return_freed_memory()  # as `ckpt export` does
before = rss("VmRSS:")
done = export_checkpoint(CheckpointStore(sys.argv[1]), 1, sys.argv[3], Path(sys.argv[2]))
print(json.dumps({"before": before, "peak": rss("VmHWM:"), "bytes": done.bytes}))
"""


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_export_memory_is_bounded_by_the_largest_tensor_not_the_model(tmp_path, fmt):
    """24 tensors of 8 MB (192 MB + the optimizer's none): the export's added peak RSS must stay
    under 4 x the largest tensor + 48 MB (112 MB), below the checkpoint's size."""
    from ckpt_tool.training.config import CheckpointConfig
    from ckpt_tool.training.manager import CheckpointManager

    model = torch.nn.Sequential(*[torch.nn.Linear(1448, 1448, bias=False) for _ in range(24)])  # 8.4 MB each
    manager = CheckpointManager(CheckpointConfig(tmp_path / "big", save_every=1), model, torch.optim.SGD(model.parameters(), lr=0.1))
    manager.save(1)
    manager.close()
    largest = 1448 * 1448 * 4
    out = tmp_path / f"big.{fmt}"
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(tmp_path / "big"), str(out), fmt], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads(done.stdout.strip().splitlines()[-1])
    bound = 4 * largest + (48 << 20)
    assert m["bytes"] > bound, "the checkpoint must be larger than the bound for this to mean anything"
    assert m["peak"] - m["before"] <= bound, f"export added {(m['peak'] - m['before']) >> 20} MiB, bound {bound >> 20} MiB"
    assert out.stat().st_size >= m["bytes"]
