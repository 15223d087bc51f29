"""The timing hook (ckpt_tool.timing): silent by default, totals and listeners on demand, names
checked against the documented list. Plain Python: no torch."""

from __future__ import annotations

import ast
import logging
import re
import threading
import time
import timeit
from pathlib import Path

import pytest

from ckpt_tool import timing
from ckpt_tool.timing import SPANS, listen, record, span

PACKAGE = Path(__file__).resolve().parents[2] / "ckpt_tool"


def test_a_span_with_nobody_listening_is_the_shared_silent_one():
    assert timing._listeners == ()
    assert span("save.write") is span("store.commit")  # nothing is made per call
    ran = []
    with span("save.write"):
        ran.append(1)
    assert ran == [1]


def test_a_silent_span_costs_well_under_a_microsecond():
    def block() -> None:
        with span("save.write"):
            pass

    n = 100_000
    per_span = min(timeit.repeat(block, number=n, repeat=5)) / n
    assert per_span < 1e-6, f"a silent span took {per_span * 1e9:.0f} ns"


def test_record_adds_up_seconds_per_name_and_take_starts_again():
    with record("save.write", "store.commit") as totals:
        for _ in range(2):
            with span("save.write"):
                time.sleep(0.01)
        with span("store.commit"):
            pass
        with span("resume.load"):  # not asked for: not kept
            time.sleep(0.01)
        assert totals.counts() == {"save.write": 2, "store.commit": 1}
        first = totals.take()
        assert set(first) == {"save.write", "store.commit"}
        assert 0.02 <= first["save.write"] < 0.5
        assert totals.take() == {}  # started again
    with span("save.write"):  # after the block: no longer listening
        pass
    assert totals.take() == {} and timing._listeners == ()


def test_record_with_no_names_keeps_every_span():
    with record() as totals:
        with span("resume.load"), span("load.dcp"):  # nested: each name has its own total
            pass
    assert set(totals.take()) == {"resume.load", "load.dcp"}


def test_spans_in_several_threads_add_up_as_thread_seconds():
    with record("save.fsync") as totals:

        def work() -> None:
            with span("save.fsync"):
                time.sleep(0.05)

        threads = [threading.Thread(target=work) for _ in range(4)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    seconds = totals.take()["save.fsync"]
    assert seconds >= 0.2 > wall  # four threads' 50 ms each, in less than 200 ms of wall time


def test_asking_for_a_span_that_does_not_exist_fails_loudly_before_listening():
    with pytest.raises(ValueError) as info:
        with record("save.write", "save.dcp_save"):
            pass
    message = str(info.value)
    assert "no such timing span: save.dcp_save" in message
    assert "save.write, save.async_start" in message  # the spans there are, to pick from
    assert "ckpt_tool.timing.SPANS" in message
    assert timing._listeners == ()


def test_a_listener_hears_name_seconds_and_the_thread_that_ran_it():
    heard: list[tuple[str, float, str]] = []
    with listen(lambda *event: heard.append(event)):

        def worker() -> None:
            with span("load.read_file"):
                time.sleep(0.01)

        thread = threading.Thread(target=worker, name="ckpt-load_0")
        thread.start()
        thread.join()
    assert [(name, thread_name) for name, _, thread_name in heard] == [("load.read_file", "ckpt-load_0")]
    assert 0.01 <= heard[0][1] < 0.5


def test_a_block_that_raises_still_reports_its_time_and_the_error_goes_on():
    with record("store.commit") as totals:
        with pytest.raises(OSError, match="No space left"):
            with span("store.commit"):
                raise OSError(28, "No space left on device")
    assert "store.commit" in totals.take()


def test_a_failing_listener_does_not_fail_the_work_it_times(caplog):
    def broken(name: str, seconds: float, thread: str) -> None:
        raise RuntimeError("listener bug")

    done = []
    with caplog.at_level(logging.WARNING, logger="ckpt_tool"), listen(broken), record("save.commit") as totals:
        with span("save.commit"):
            done.append(1)
    assert done == [1] and "save.commit" in totals.take()
    assert "a timing listener failed on span save.commit" in caplog.text


def test_two_listeners_each_hear_every_span_and_leave_in_any_order():
    a, b = [], []
    outer = listen(lambda n, s, t: a.append(n))
    outer.__enter__()
    with listen(lambda n, s, t: b.append(n)):
        with span("save.write"):
            pass
        outer.__exit__(None, None, None)  # the first one leaves while the second listens
        with span("save.commit"):
            pass
    assert a == ["save.write"] and b == ["save.write", "save.commit"] and timing._listeners == ()


# ----------------------------------------------------------------------------- the documented list
def spans_used_in_the_package() -> dict[str, list[str]]:
    """Every ``span("...")`` call in the package's source: name -> the files calling it."""
    used: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "span":
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path}: span() takes a literal name"
                used.setdefault(node.args[0].value, []).append(str(path.relative_to(PACKAGE.parent)))
    return used


def test_every_span_the_package_emits_is_documented_and_every_documented_one_is_emitted():
    used = spans_used_in_the_package()
    undocumented = {n: files for n, files in used.items() if n not in SPANS}
    assert not undocumented, f"add these to ckpt_tool.timing.SPANS and its table: {undocumented}"
    assert set(SPANS) - set(used) == set(), "documented spans nothing emits"


def test_the_docstring_table_lists_the_spans_in_order():
    table = re.findall(r"^([a-z_]+\.[a-z_]+)\s{2,}\S", timing.__doc__ or "", flags=re.MULTILINE)
    assert table == list(SPANS)
    assert all(description for description in SPANS.values())


def test_the_hook_imports_nothing_but_the_standard_library():
    """Every layer imports it (the store too, which must stay light): it may import nothing of
    the package and no third-party module."""
    tree = ast.parse((PACKAGE / "timing.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "logging", "threading", "time", "collections", "contextlib", "types"}, imported
