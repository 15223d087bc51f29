"""Values of the job options that SLURM and torchrun parse: checked here, before anything
starts or is queued, with the forms they accept. Pure: a string in, the value or a
``ValueError`` whose message names the accepted forms.

- ``--time``: SLURM's ``MINUTES``, ``MINUTES:SECONDS``, ``HOURS:MINUTES:SECONDS``, ``DAYS-HOURS``,
  ``DAYS-HOURS:MINUTES``, ``DAYS-HOURS:MINUTES:SECONDS``, or ``UNLIMITED``/``infinite``. sbatch
  itself takes ``25:99:99`` (and carries the overflow): a field after the first past 59 (hours
  past 23 after days) is a typo, refused.
- ``--mem``: a whole number with an optional unit K, M, G or T (SLURM's default unit: megabytes).
- ``--nnodes``: torchrun's ``N`` or ``MIN:MAX``, 1 <= MIN <= MAX.
- ``--rdzv-endpoint``: ``HOST`` or ``HOST:PORT`` (``[IPv6]:PORT``), port 1..65535.
"""

from __future__ import annotations

import re

TIME_FORMS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS or UNLIMITED"
MEM_FORMS = "a whole number with an optional unit K, M, G or T (megabytes without one), e.g. 64G or 500M"
_UNLIMITED = ("unlimited", "infinite")
_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)
_MB = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
_HOST = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_time(text: str) -> int | None:
    """A SLURM time limit in seconds (``None``: unlimited; 0 is SLURM's "no limit" too)."""
    if text.strip().lower() in _UNLIMITED:
        return None
    days = _DAYS.match(text)
    clock = None if days else _CLOCK.match(text)
    if days:
        d, h, m, s = (int(v) if v else 0 for v in days.groups())
        fields = {"hours": (h, 23), "minutes": (m, 59), "seconds": (s, 59)}
    elif clock:
        given = [int(v) for v in clock.groups() if v is not None]
        d, (h, m, s) = 0, ([0, *given, 0] if len(given) == 1 else [0, *given] if len(given) == 2 else given)
        fields = {"minutes": (m, 59 if len(given) == 3 else None), "seconds": (s, 59 if len(given) > 1 else None)}
    else:
        raise ValueError(f"{text!r} is not a SLURM time: use {TIME_FORMS}")
    for name, (value, most) in fields.items():
        if most is not None and value > most:
            raise ValueError(f"{text!r}: {value} {name} is past {most} (SLURM's forms: {TIME_FORMS})")
    return ((d * 24 + h) * 60 + m) * 60 + s


def parse_mem(text: str) -> int:
    """A SLURM memory size in megabytes (rounded up; 0: SLURM's "all the node's memory")."""
    match = _MEM.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a SLURM memory size: {MEM_FORMS}")
    number, unit = int(match.group(1)), match.group(2).upper()
    return -(-number // 1024) if unit == "K" else number * _MB[unit]


def parse_nnodes(text: str) -> tuple[int, int]:
    """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX`` as (MIN, MAX)."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise ValueError(f"--nnodes {text!r} is not a node count: give N or MIN:MAX (whole numbers), e.g. 2 or 1:4") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"--nnodes {text!r}: need 1 <= MIN <= MAX, e.g. 2 or 1:4")
    return lo, hi


def parse_endpoint(text: str) -> tuple[str, int | None]:
    """torchrun's ``--rdzv-endpoint``: ``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT`` as (host, port)."""
    form = "give HOST:PORT, e.g. node1:29500 (or [::1]:29500)"
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
        if not sep or not host or (rest and port is None):
            raise ValueError(f"--rdzv-endpoint {text!r} is not HOST:PORT: {form}")
    else:
        host, sep, port_text = text.partition(":")
        port = port_text if sep else None
        if not _HOST.match(host):
            raise ValueError(f"--rdzv-endpoint {text!r}: {host!r} is not a host name or address: {form}")
    if port is None:
        return host, None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--rdzv-endpoint {text!r}: the port {port!r} is not a number from 1 to 65535: {form}")
    return host, int(port)
