"""The benchmarks time the package only through its documented spans (ckpt_tool.timing): every
phase a figure shows names spans that exist, and a name that does not fails before any timing."""

from __future__ import annotations

import re

import pytest

from ckpt_tool.timing import SPANS

from .bench_scripts import BENCH, bench_module


@pytest.mark.parametrize(
    ("script", "table"),
    [("save_throughput", "PHASES"), ("load_throughput", "PHASES"), ("validate_throughput", "PHASES"), ("reshard_speed", "LOAD_PHASES")],
)
def test_every_phase_of_a_figure_is_made_of_spans_that_exist(script, table):
    phases = getattr(bench_module(script), table)
    assert phases and all(names for names in phases.values())
    missing = {label: [n for n in names if n not in SPANS] for label, names in phases.items() if set(names) - set(SPANS)}
    assert not missing, f"bench/{script}.py asks for spans that do not exist: {missing}"


def test_a_phase_timer_asking_for_a_span_that_is_gone_fails_at_once():
    common = bench_module("common")
    with pytest.raises(ValueError, match=r"no such timing span: save\.dcp_save.*ckpt_tool\.timing\.SPANS"):
        common.PhaseTimer({"dcp_save": ("save.dcp_save",)})


def test_no_benchmark_patches_the_package_or_torch():
    """The old harness set attributes of package classes and modules (and of torch's dcp and
    os.fsync) to time them; a rename broke a figure silently."""
    patching = re.compile(r"\bsetattr\(|\.wrap\(|^\s*(mgr|manager|store|saver|dcp|os|torch_state)\.[\w.]+\s*(,\s*[\w.]+\s*)*=[^=]", re.M)
    found = {p.name: m.group(0).strip() for p in sorted(BENCH.glob("*.py")) if (m := patching.search(p.read_text()))}
    assert not found, found
