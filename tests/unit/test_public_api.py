import subprocess
import sys

import pytest

import ckpt_tool


@pytest.mark.parametrize("name", [n for n in ckpt_tool.__all__ if n != "__version__"])
def test_every_public_name_resolves(name):
    assert getattr(ckpt_tool, name).__name__ == name


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        ckpt_tool.nothing_here  # noqa: B018


def test_the_cli_does_not_import_torch_for_pointer_reads(tmp_path):
    code = "import sys; from ckpt_tool.cli import main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
