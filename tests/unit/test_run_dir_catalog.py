"""The catalog of events (``core.run_catalog``) is the one list: every event name the package,
the batch template and bench write is in it, and every run event in it is written somewhere.
A name that is in neither (a typo, a new event nobody listed) fails here, naming file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ckpt_tool.core import run_catalog as catalog
from ckpt_tool.core.history import KNOWN_EVENTS, MARKS, unknown_events
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.supervise.rank_reports import LOGGED

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^[a-z][a-z0-9_]*$")

# call -> which positional argument holds the event name, and the log it goes to
RUN_CALLS = {"note": None, "event": 0, "Finding": 0}  # note: (run_dir, NAME) or (NAME) in slurm.chain
INDEX_CALLS = {"append_event": 0, "_record": 0, "record_check": 1, "rewrite_manifest": 2, "MoveLatest": 2, "set_latest": 2}


def module_constants() -> dict[str, str]:
    """``NAME = "text"`` at the top of the package's modules (``LEAVE_EVENT``, ``ADOPTED``): a
    writer that names its event by such a constant is seen through it."""
    out = {}
    for path in (ROOT / "ckpt_tool").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return out


CONSTANTS = module_constants()


def _const(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Name) and node.id.isupper():
        node = ast.Constant(CONSTANTS.get(node.id))
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value) else None


def written_names(source: str, where: str) -> list[tuple[str, str, str]]:
    """(name, log, file:line) of every event name ``source`` writes as a literal: the calls that
    write events, ``(NAME, {fields})`` pairs handed to a writer, ``{"event": NAME}`` lineage entries."""
    found = []
    for node in ast.walk(ast.parse(source)):
        at = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = node.args
            if func == "note":
                name = _const(args[0]) if args else None
                name = name or (_const(args[1]) if len(args) > 1 else None)
                if name:
                    found.append((name, "run", at))
            elif func == "send_event" and args and _const(args[0]) in LOGGED:  # a rank's event its watchdog logs as it is
                found.append((_const(args[0]), "run", at))
            elif func in RUN_CALLS and len(args) > RUN_CALLS[func] and _const(args[RUN_CALLS[func]]):
                found.append((_const(args[RUN_CALLS[func]]), "run", at))
            elif func in INDEX_CALLS:
                pos = INDEX_CALLS[func]
                arg = args[pos] if len(args) > pos else next((k.value for k in node.keywords if k.arg == "event"), None)
                if _const(arg):
                    found.append((_const(arg), "index", at))
        elif isinstance(node, ast.Tuple):
            for a, b in zip(node.elts, node.elts[1:], strict=False):
                if _const(a) and isinstance(b, ast.Dict):
                    found.append((_const(a), "run", at))
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "event" and _const(v):
                    found.append((_const(v), "index", at))
    return found


def template_names(text: str, where: str) -> list[tuple[str, str, str]]:
    """``ckpt note "$RUN_DIR" NAME`` in a batch template."""
    return [
        (m.group(1), "run", f"{where}:{text[: m.start()].count(chr(10)) + 1}")
        for m in re.finditer(r"\bnote\s+\"?\$+\{?RUN_DIR\}?\"?\s+([A-Za-z0-9_.]+)", text)
    ]


def every_name_written() -> list[tuple[str, str, str]]:
    found = []
    ours = [*(ROOT / "ckpt_tool").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    for path in sorted(p for p in ours if ".venvs" not in p.parts):  # not the peers' venvs (make bench-peers)
        found += written_names(path.read_text(), str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "slurm_templates").glob("*")):
        found += template_names(path.read_text(), str(path.relative_to(ROOT)))
    return found


def test_every_event_written_is_in_the_catalog():
    run_names = {e.name for e in catalog.RUN_EVENTS}
    index_names = {e.name for e in catalog.CHECKPOINT_EVENTS}
    wrong = [
        f"{at}: {name!r} ({log} log) is not in core/run_catalog.py's {'RUN_EVENTS' if log == 'run' else 'CHECKPOINT_EVENTS'}"
        for name, log, at in every_name_written()
        if name not in (run_names if log == "run" else index_names)
    ]
    assert not wrong, "\n".join(wrong)


def test_every_run_event_of_the_catalog_is_written_somewhere():
    """No stale entry: the scan finds a writer of each (and so the scan itself finds what it should)."""
    written = {name for name, log, _ in every_name_written() if log == "run"}
    stale = sorted({e.name for e in catalog.RUN_EVENTS} - written)
    assert not stale, f"listed in RUN_EVENTS but written nowhere: {stale}"


def test_the_scan_sees_each_way_a_name_is_written():
    source = """
note(run_dir, "bogus_a", x=1)
chain_note = note("bogus_b")
self.event("bogus_c", rank=1)
return ExitCode.FAILED, "bogus_d", {"note": "x"}
events.append(("bogus_e", {"count": 1}))
store.append_event("bogus_f", step=1)
entry = {"event": "bogus_g", "time": 0}
Finding("bogus_h", 1, "step", 1, 0.1, 0.1, 0.5, 3)
note(run_dir, LEAVE_EVENT, drop=[])
print("not an event", {"x": 1})
"""
    got = {(n, log) for n, log, _ in written_names(source, "x.py")}
    assert got == {
        ("bogus_a", "run"), ("bogus_b", "run"), ("bogus_c", "run"), ("bogus_d", "run"),
        ("bogus_e", "run"), ("bogus_f", "index"), ("bogus_g", "index"), ("bogus_h", "run"), ("nodes_left_behind", "run"),
    }  # fmt: skip
    assert template_names('"$${CKPT[@]}" note "$$RUN_DIR" bogus_t restarts="$$R"\n', "t") == [("bogus_t", "run", "t:1")]


def test_history_knows_exactly_the_catalog():
    assert set(KNOWN_EVENTS) == set(catalog.EVENTS)
    assert set(MARKS) <= set(catalog.EVENTS), "the story marks an event nobody writes"
    assert unknown_events(["warm_off", "job_stopped", "user.lr_drop", "nope"], []) == ["nope"]


def test_run_and_index_events_do_not_share_a_name():
    runs = [e.name for e in catalog.RUN_EVENTS]
    index = [e.name for e in catalog.CHECKPOINT_EVENTS]
    assert len(set(runs)) == len(runs) and len(set(index)) == len(index) and not set(runs) & set(index)
    assert all(e.fields == tuple(dict.fromkeys(e.fields)) and e.meaning and e.written_by for e in catalog.EVENTS.values())


@pytest.mark.parametrize("name", ["start", "job_start", "user.lr_drop", "user.x.y"])
def test_a_run_event_or_a_user_event_may_be_written(name):
    assert catalog.check_event_name(name) == name


@pytest.mark.parametrize(
    ("name", "says"),
    [("jb_start", "not an event ckpt-tool knows"), ("commit", "index.jsonl event"), ("user.", "not an event"), ("", "not an event")],
)
def test_any_other_name_is_refused_with_the_rule(name, says):
    with pytest.raises(CkptError) as exc:
        catalog.check_event_name(name)
    assert exc.value.exit_code == ExitCode.USAGE and says in exc.value.message
    assert "user.NAME" in exc.value.hint and "job_start" in exc.value.hint


def test_the_tables_for_the_readme_list_every_event_and_file():
    events, files = catalog.events_table(), catalog.files_table()
    assert all(f"| `{e.name}` |" in events for e in catalog.RUN_EVENTS)
    assert all(f"| `{f.name}` | {f.version} |" in files for f in catalog.FILES)


def test_a_mistyped_event_name_is_refused_naming_the_event_meant() -> None:
    with pytest.raises(CkptError) as refused:
        catalog.check_event_name("jbo_start")
    assert "not an event ckpt-tool knows (did you mean 'job_start'?)" in refused.value.message
    assert "user.jbo_start" in refused.value.hint
    with pytest.raises(CkptError) as unlike:
        catalog.check_event_name("lr_drop")
    assert "did you mean" not in unlike.value.message
