import subprocess
import sys

import pytest

import ckpt_tool


@pytest.mark.parametrize("name", [n for n in ckpt_tool.__all__ if n != "__version__"])
def test_every_public_name_resolves(name):
    assert getattr(ckpt_tool, name).__name__ == name


def test_all_lists_every_export():
    assert set(ckpt_tool.__all__) == {"__version__", *ckpt_tool._EXPORTS}


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        ckpt_tool.nothing_here  # noqa: B018


def test_the_cli_does_not_import_torch_for_pointer_reads(tmp_path):
    """`ckpt list DIR --latest` answers from LATEST alone: no torch import (seconds) on the way."""
    (tmp_path / "LATEST").write_text("step_00000020\n")
    (tmp_path / "step_00000020").mkdir()
    (tmp_path / "step_00000020" / "ckpt_manifest.json").write_text("{}")
    code = (
        "import sys\n"
        "from ckpt_tool.cli.main import main\n"
        f"try:\n    main(['list', {str(tmp_path)!r}, '--latest'])\nexcept SystemExit as e:\n    print('exit', e.code)\n"
        "print('torch imported:', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "20" and out[1] in ("exit 0", "exit None") and out[2] == "torch imported: False"
