"""CheckpointManager in one process (no torchrun): exact resume, fallback, errors, hostile files."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tool.core import layout
from ckpt_tool.core.manifest import Manifest
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.checksums import binding_seed, hash_file
from ckpt_tool.store.store import CheckpointStore
from ckpt_tool.training.safe_dcp import load_state

from .tiny import loss_fn, make_trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def run_steps(trainer, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last + 1):
        losses.append(trainer.step())
        trainer.manager.maybe_save(step)
    return losses


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_is_bit_identical(tmp_path, async_save):
    ref = make_trainer(tmp_path / "ref", save_every=0)
    reference = run_steps(ref, 1, 10)
    ref.manager.close()

    a = make_trainer(tmp_path / "run", save_every=4, async_save=async_save)
    first = run_steps(a, 1, 6)  # saves at 4; steps 5-6 are lost at the "crash"
    a.manager.close(final=False)  # a crash saves nothing more
    torch.manual_seed(12345)  # the crash loses every RNG state
    b = make_trainer(tmp_path / "run", seed=99, save_every=4, async_save=async_save)
    start = b.manager.resume()
    assert start == 4
    resumed = run_steps(b, start + 1, 10)
    b.manager.close()
    assert first == reference[:6]
    assert resumed == reference[4:]  # exact float equality, not approx


def test_gradients_present_at_resume_do_not_make_it_skip_the_optimizer_state(tmp_path):
    # torch's get_state_dict leaves an empty optimizer state empty when gradients exist, so DCP
    # would load no optimizer state at all: a warm-up backward before resume() must not cost
    # the Adam moments.
    ref = make_trainer(tmp_path / "ref", save_every=0)
    reference = run_steps(ref, 1, 8)
    ref.manager.close()
    a = make_trainer(tmp_path / "run", save_every=4)
    run_steps(a, 1, 4)
    a.manager.close()
    b = make_trainer(tmp_path / "run", seed=99, save_every=4)
    loss_fn(b.model, {"x": torch.ones(2, 16), "y": torch.zeros(2, 4)}).backward()
    assert b.manager.resume() == 4
    assert len(b.optimizer.state) == len(a.optimizer.state)
    for p_b, p_a in zip(b.model.parameters(), a.model.parameters(), strict=True):
        assert torch.equal(b.optimizer.state[p_b]["exp_avg"], a.optimizer.state[p_a]["exp_avg"])
    assert run_steps(b, 5, 8) == reference[4:]
    b.manager.close()


def test_a_save_behind_the_newest_checkpoint_is_refused(tmp_path):
    # LATEST would move back, and the next start would roll forward to the higher (older) step.
    t = make_trainer(tmp_path / "c", save_every=4)
    run_steps(t, 1, 4)
    t.step()
    with pytest.raises(CkptError) as err:
        t.manager.save(3)
    assert err.value.exit_code == ExitCode.USAGE and "already holds checkpoint step 4" in err.value.message
    t.manager.save(4)  # the same step again supersedes it
    t.manager.close()
    fresh = make_trainer(tmp_path / "c", save_every=4)  # a new run that forgot resume()
    with pytest.raises(CkptError, match="steps must not go back"):
        fresh.manager.save(2)
    fresh.manager.close()
    store = CheckpointStore(tmp_path / "c")
    assert store.read_latest() == 4 and store.committed_on_disk() == [4]


def test_fresh_directory_resumes_to_none(tmp_path):
    t = make_trainer(tmp_path / "new")
    assert t.manager.resume() is None
    t.manager.close()


def test_manifest_records_what_the_trajectory_depends_on(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 1)
    t.manager.close()
    m = CheckpointStore(tmp_path / "c").read_manifest(1)
    assert m.world_size == 1 and m.env["threads"] == torch.get_num_threads() and m.env["dtype"] == "float32"
    assert m.env["torch"] == torch.__version__
    assert m.probe is not None and m.probe.step == 1 and m.probe.loss > 0 and m.probe.grad_norm > 0
    assert {f.path for f in m.files} >= {".metadata", "__0_0.distcp", "rank_00000.state.json"}


def test_probe_does_not_disturb_training(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=0)
    t.step()
    x = torch.randn(8, 16)
    t.model(x).sum().backward()  # grads present at save time
    grads = [p.grad.clone() for p in t.model.parameters()]
    rng_before = torch.get_rng_state()
    t.manager.save(1)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, t.model.parameters(), strict=True))
    assert t.model.training
    t.manager.close()


def test_damaged_newest_checkpoint_is_quarantined_and_previous_used(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=2)
    run_steps(t, 1, 4)
    t.manager.close()
    shard = tmp_path / "c" / "step_00000004" / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    shard.write_bytes(bytes(raw))
    t2 = make_trainer(tmp_path / "c", save_every=2)
    assert t2.manager.resume() == 2
    t2.manager.close()
    store = CheckpointStore(tmp_path / "c")
    assert store.read_latest() == 2
    assert not store.step_path(4).exists()
    assert [e.event for e in store.events()][-2:] == ["quarantine", "rollback"]


def swap_in(trainer, model=None, optimizer=None):
    """Change the run's code between save and resume: another model or optimizer."""
    if model is not None:
        trainer.model = trainer.manager.state.model = model
    if optimizer is not None:
        trainer.optimizer = trainer.manager.state.optimizer = optimizer
    return trainer


@pytest.mark.parametrize("change", ["optimizer", "model"])
def test_a_checkpoint_that_does_not_fit_the_run_is_refused_not_quarantined(tmp_path, change):
    t = make_trainer(tmp_path / "c", save_every=2)
    run_steps(t, 1, 4)
    t.manager.close()
    t2 = make_trainer(tmp_path / "c", save_every=2)
    if change == "optimizer":  # SGD with momentum: its buffers are not in an AdamW checkpoint
        swap_in(t2, optimizer=torch.optim.SGD(t2.model.parameters(), lr=0.1, momentum=0.9))
    else:  # a wider first layer
        model = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(48, 4))
        swap_in(t2, model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    with pytest.raises(CkptError) as err:
        t2.manager.resume()
    t2.manager.close()
    assert err.value.exit_code == ExitCode.CONFLICT
    message = err.value.message
    assert "does not fit this run's model or optimizer" in message
    if change == "optimizer":
        assert "not in the checkpoint" in message and "momentum" in message, message
    else:
        assert "another shape" in message and "[48, 16] (saved [32, 16])" in message, message
    store = CheckpointStore(tmp_path / "c")
    assert store.read_latest() == 4 and store.step_path(4).exists() and store.step_path(2).exists()
    assert "quarantine" not in [e.event for e in store.events()]


def test_checkpoint_entries_the_run_does_not_ask_for_are_named(tmp_path, caplog):
    t = make_trainer(tmp_path / "c", save_every=2)
    run_steps(t, 1, 2)
    t.manager.close()
    t2 = make_trainer(tmp_path / "c", save_every=2)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32, bias=False), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )  # a bias dropped
    swap_in(t2, model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    with caplog.at_level("WARNING", logger="ckpt_tool"):
        assert t2.manager.resume() == 2
    t2.manager.close()
    [warning] = [r.getMessage() for r in caplog.records if "were not loaded" in r.getMessage()]
    assert "model.0.bias" in warning and "optim.state.0.bias.exp_avg" in warning, warning
    assert torch.equal(model[0].weight, t.model[0].weight)  # what fits is loaded
    assert "probe" not in warning  # the stored probe batch is verification's, not resume's
    caplog.clear()
    t3 = make_trainer(tmp_path / "c", save_every=2)  # the run's own model and optimizer
    with caplog.at_level("WARNING", logger="ckpt_tool"):
        assert t3.manager.resume() == 2
    t3.manager.close()
    assert not [r for r in caplog.records if "were not loaded" in r.getMessage() or "probe check" in r.getMessage()]


def test_garbage_latest_falls_back_to_newest_on_disk(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=2)
    run_steps(t, 1, 4)
    t.manager.close()
    (tmp_path / "c" / "LATEST").write_bytes(b"\xff\xfe junk")
    t2 = make_trainer(tmp_path / "c")
    assert t2.manager.resume() == 4
    t2.manager.close()


def test_every_checkpoint_damaged_is_a_clear_error(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 2)
    t.manager.close()
    for step in (1, 2):
        (tmp_path / "c" / layout.step_dir_name(step) / "__0_0.distcp").write_bytes(b"x")
    t2 = make_trainer(tmp_path / "c")
    with pytest.raises(CkptError) as err:
        t2.manager.resume()
    assert err.value.exit_code == ExitCode.NOT_FOUND and "no committed checkpoint is left" in err.value.message


def rewrite_manifest(directory: Path, step: int, **changes) -> None:
    path = directory / layout.step_dir_name(step) / layout.MANIFEST_NAME
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_world_size_change_without_a_recorded_batch_split_is_refused(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 1)
    t.manager.close()
    rewrite_manifest(tmp_path / "c", 1, world_size=2, mesh=None)
    # the structure check would call it damaged (one rank file for two ranks): see the next test
    t2 = make_trainer(tmp_path / "c", validate_on_resume=False)
    with pytest.raises(CkptError) as err:
        t2.manager.resume()
    assert err.value.exit_code == ExitCode.CONFLICT and "records no batch split" in err.value.message


def test_validation_checks_every_rank_of_the_mesh_has_its_state(tmp_path):
    from ckpt_tool.training.validation import validate_checkpoint

    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 1)
    t.manager.close()
    assert validate_checkpoint(CheckpointStore(tmp_path / "c"), 1).ok
    rewrite_manifest(tmp_path / "c", 1, world_size=2, mesh={"dims": [["dp_shard", 1], ["tp", 2]]})
    problems = [str(p) for p in validate_checkpoint(CheckpointStore(tmp_path / "c"), 1).problems]
    assert any("mesh dp_shard 1 x tp 2: no state file listed for rank 1" in p for p in problems), problems


def test_a_newer_format_version_is_refused_and_left_in_place(tmp_path):
    """A checkpoint written by a newer ckpt-tool is not damage: resume() refuses it (exit 4)
    and moves nothing, as ``ckpt validate`` does; upgrading ckpt-tool then resumes from it."""
    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 2)
    t.manager.close()
    rewrite_manifest(tmp_path / "c", 2, format_version=99)
    t2 = make_trainer(tmp_path / "c")
    with pytest.raises(CkptError) as err:
        t2.manager.resume()
    assert err.value.exit_code == ExitCode.CONFLICT
    assert "format version 99" in err.value.message and "upgrade ckpt-tool" in err.value.hint
    store = CheckpointStore(tmp_path / "c")
    assert store.read_latest() == 2 and store.committed_on_disk() == [1, 2]
    assert not store.quarantine_root.exists()
    assert not [e for e in store.events() if e.event in ("quarantine", "rollback")]


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_dcp_metadata_is_refused_without_running_it(tmp_path):
    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 1)
    t.manager.close()
    d = tmp_path / "c" / "step_00000001"
    marker = tmp_path / "pwned"
    (d / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
    # An attacker who can write files can also fix the manifest's hash: the loader must hold anyway.
    m = Manifest.from_json((d / layout.MANIFEST_NAME).read_text())
    digest = hash_file(d / ".metadata", binding_seed(m.run_id, 1, ".metadata"))
    files = [f if f.path != ".metadata" else f.__class__(".metadata", digest.bytes, digest.hash, 0) for f in m.files]
    (d / layout.MANIFEST_NAME).write_text(Manifest(**{**m.__dict__, "files": tuple(files)}).to_json())
    t2 = make_trainer(tmp_path / "c", max_fallbacks=0)
    with pytest.raises(CkptError, match="no valid checkpoint"):
        t2.manager.resume()
    assert not marker.exists()
    [quarantine] = [e for e in CheckpointStore(tmp_path / "c").events() if e.event == "quarantine"]
    # found by the load's own check of .metadata (the structure check leaves it to the load: one read)
    assert ".metadata: refused to load posix.system" in quarantine.data["reason"]
    # and loading it directly, past validation, refuses too
    with pytest.raises(CkptError, match="refused to load posix.system"):
        load_state({"model": {}}, next((tmp_path / "c" / "quarantine").iterdir()), no_dist=True)
    assert not marker.exists()


def test_hostile_byte_entry_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    dcp.save({"evil": Payload(str(marker)), "w": torch.ones(2)}, checkpoint_id=tmp_path / "d", no_dist=True)
    target = {"evil": None, "w": torch.zeros(2)}
    with pytest.raises(CkptError, match="refused to load the checkpoint entry 'evil'"):
        load_state(target, tmp_path / "d", no_dist=True)
    assert not marker.exists()


def test_sigterm_waits_for_the_inflight_async_save(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent.parent.parent)!r})
        import time
        from tests.integration.tiny import make_trainer
        t = make_trainer({str(tmp_path / "c")!r}, async_save=True, before_commit=lambda step: time.sleep(2.0))
        t.step()
        t.manager.save(1)
        os.kill(os.getpid(), signal.SIGTERM)
        print("not reached")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -15, proc.stderr
    assert "not reached" not in proc.stdout
    assert CheckpointStore(tmp_path / "c").read_latest() == 1


def test_resume_under_another_thread_count_says_it_will_not_be_bit_identical(tmp_path, caplog):
    threads = torch.get_num_threads()
    t = make_trainer(tmp_path / "c", save_every=1)
    run_steps(t, 1, 1)
    t.manager.close()
    rewrite_manifest(tmp_path / "c", 1, env={**CheckpointStore(tmp_path / "c").read_manifest(1).env, "threads": threads + 1})
    t2 = make_trainer(tmp_path / "c")
    with caplog.at_level("WARNING", logger="ckpt_tool"):
        assert t2.manager.resume() == 1
    t2.manager.close()
    assert any("will not be bit-identical" in r.message and "thread count" in r.message for r in caplog.records)


def test_close_saves_the_last_step_unless_configured_off(tmp_path):
    t = make_trainer(tmp_path / "on", save_every=5)
    run_steps(t, 1, 7)
    t.manager.close()
    assert CheckpointStore(tmp_path / "on").committed_on_disk() == [5, 7]
    off = make_trainer(tmp_path / "off", save_every=5, save_final=False)
    run_steps(off, 1, 7)
    off.manager.close()
    assert CheckpointStore(tmp_path / "off").committed_on_disk() == [5]


def test_no_final_save_while_an_exception_propagates(tmp_path):
    """A step that raised half-way (optimizer stepped, maybe_save not reached) must not be saved
    under the previous step's number."""
    t = make_trainer(tmp_path / "c", save_every=5)
    with pytest.raises(RuntimeError):
        try:
            run_steps(t, 1, 7)
            raise RuntimeError("the loop died")
        finally:
            t.manager.close()
    assert CheckpointStore(tmp_path / "c").committed_on_disk() == [5]
