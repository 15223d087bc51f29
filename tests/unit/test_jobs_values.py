"""The values SLURM and torchrun parse, checked before anything starts or is queued."""

from __future__ import annotations

import pytest

from ckpt_tool.core.launch_values import parse_endpoint, parse_mem, parse_nnodes, parse_time


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90 * 60),
        ("5:30", 5 * 60 + 30),
        ("24:00:00", 24 * 3600),
        ("100:00:00", 100 * 3600),
        ("1-0", 24 * 3600),
        ("1-2:3", 26 * 3600 + 180),
        ("2-00:00:00", 48 * 3600),
        ("1-2:3:4", 26 * 3600 + 184),
        ("0", 0),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_slurm_time_forms_are_accepted(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize(
    "text, words",
    [
        ("25:99:99", "99 minutes is past 59"),
        ("1:60:00", "60 minutes is past 59"),
        ("0:60", "60 seconds is past 59"),
        ("1-25", "25 hours is past 23"),
        ("abc", "not a SLURM time"),
        ("1:2:3:4", "not a SLURM time"),
        ("-5", "not a SLURM time"),
        ("24h", "not a SLURM time"),
        ("", "not a SLURM time"),
    ],
)
def test_a_bad_time_is_refused_with_the_forms(text, words):
    with pytest.raises(ValueError) as e:
        parse_time(text)
    assert words in str(e.value) and "DAYS-HOURS:MINUTES:SECONDS" in str(e.value)


@pytest.mark.parametrize(
    "text, mb", [("64G", 65536), ("64g", 65536), ("500", 500), ("500M", 500), ("2T", 2 << 20), ("10K", 1), ("0", 0), ("64GB", 65536)]
)
def test_slurm_memory_sizes(text, mb):
    assert parse_mem(text) == mb


@pytest.mark.parametrize("text", ["lots", "1.5G", "64Gi", "-1G", "G", ""])
def test_a_bad_memory_size_is_refused_with_the_forms(text):
    with pytest.raises(ValueError, match="not a SLURM memory size: a whole number with an optional unit K, M, G or T"):
        parse_mem(text)


def test_nnodes():
    assert parse_nnodes("2") == (2, 2) and parse_nnodes("1:4") == (1, 4)
    for bad, words in [
        ("abc", "not a node count"),
        ("3:1", "MIN <= MAX"),
        ("0", "MIN <= MAX"),
        ("1:", "not a node count"),
        ("2.5", "not a node count"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_nnodes(bad)


def test_rendezvous_endpoint():
    assert parse_endpoint("node1:29500") == ("node1", 29500) and parse_endpoint("10.0.0.1") == ("10.0.0.1", None)
    assert parse_endpoint("[::1]:29500") == ("::1", 29500)
    for bad, words in [
        ("node1:abc", "not a number from 1 to 65535"),
        ("node1:70000", "1 to 65535"),
        (":29500", "not a host"),
        ("a b:1", "not a host"),
        ("[::1", "not HOST:PORT"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_endpoint(bad)
