import pytest

from ckpt_tool import config
from ckpt_tool.errors import CkptError


def test_ckpt_toml_wins_over_pyproject_and_parents_are_searched(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt]\nentry_point = "a:b"\n')
    sub = tmp_path / "sub" / "deeper"
    sub.mkdir(parents=True)
    assert config.default("entry_point", sub) == "a:b"
    (tmp_path / "sub" / "ckpt.toml").write_text('entry_point = "c:d"\n')
    assert config.default("entry_point", sub) == "c:d"


def test_pyproject_without_tool_ckpt_is_skipped(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert config.find_config(tmp_path) is None or config.find_config(tmp_path)[0].parent != tmp_path


def test_invalid_toml_is_a_clear_error(tmp_path):
    (tmp_path / "ckpt.toml").write_text("entry_point = \n")
    with pytest.raises(CkptError, match="not valid TOML"):
        config.default("entry_point", tmp_path)
