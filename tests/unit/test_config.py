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


@pytest.mark.parametrize(
    "text, message, hint",
    [
        ("time = 5\n", "time must be a string, got int 5", 'time = "24:00:00"'),
        ('partition = ["a", "b"]\n', "partition must be a string, got an array ['a', 'b']", 'partition = "gpu"'),
        ("cpus_per_task = true\n", "cpus_per_task must be an integer, got bool True", "cpus_per_task = 32"),
        ('partiton = "gpu"\n', "unknown key 'partiton' (did you mean 'partition'?)", "known keys: entry_point, time"),
        ('colour = "red"\n', "unknown key 'colour'", "known keys"),
    ],
)
def test_wrong_keys_and_types_are_clear_errors(tmp_path, text, message, hint):
    (tmp_path / "ckpt.toml").write_text(text)
    with pytest.raises(CkptError) as err:
        config.default("time", tmp_path)
    assert err.value.exit_code == 2 and message in err.value.message and str(tmp_path / "ckpt.toml") in err.value.message
    assert hint in err.value.hint


def test_the_same_checks_apply_to_tool_ckpt_in_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ckpt]\nqos = 3\n")
    with pytest.raises(CkptError, match="qos must be a string"):
        config.default("qos", tmp_path)
