"""Files the tool creates respect the umask; the lock and the pointer are never world-writable."""

from __future__ import annotations

import os
import stat

import pytest

from ..integration.tiny import make_trainer

pytestmark = [pytest.mark.faults, pytest.mark.filterwarnings("ignore::UserWarning")]


def modes(root):
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("umask", [0o077, 0o000])
def test_umask_is_respected_and_nothing_is_world_writable(tmp_path, umask):
    old = os.umask(umask)
    try:
        t = make_trainer(tmp_path / "c", save_every=1)
        t.step()
        t.manager.maybe_save(1)
        t.manager.close()
    finally:
        os.umask(old)
    found = modes(tmp_path / "c")
    assert {"LATEST", ".lock", ".owner.json", "index.jsonl", "step_00000001/ckpt_manifest.json"} <= set(found)
    for name, mode in found.items():
        assert not mode & stat.S_IWOTH, f"{name} is world-writable ({oct(mode)})"
        if umask == 0o077:
            assert not mode & 0o077, f"{name} ignores the umask ({oct(mode)})"
