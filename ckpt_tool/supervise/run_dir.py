"""The one reader and writer of a run directory (``RUN_DIR``, by default ``CKPT_DIR/run``).

Every file of it (``core.run_catalog.FILES``) is read and written here and nowhere else:

- ``events.jsonl``: ``note`` appends one event (fsynced; a name not in ``core.run_catalog`` and
  not a user's ``user.NAME`` is refused, nothing written), ``load_events`` reads them back,
  skipping torn lines (reported by number) and keeping fields it does not know;
- ``health.json``, ``round_end.json``, ``timeouts.json``: JSON objects with a ``version``,
  replaced atomically and fsynced (``store.durable.atomic_write``);
- ``stacks_request.json`` asks every node's watchdog for its ranks' stacks, ``hangs/<id>/``
  holds them (``rank_R.txt``, written by ``supervise.stacks``) and ``report.json``;
- ``command.json``: the training command ``ckpt run`` ran (``write_command``/``read_command``);
- ``anomaly.json``: the last wrong number and its replay (``write_anomaly``/``read_anomaly``);
  ``metrics/rank_R.jsonl``: each rank's values, a line a step (``MetricsRecord``, ``recent_metrics``);
- ``ranks.NODE.json``, ``rank_health.NODE.json``: rewritten every few seconds, replaced
  atomically without an fsync (``replace_quietly``: they inform, nothing depends on them, and an
  fsync per write on a shared filesystem costs more than they are worth).

A file written by a newer ckpt-tool (a higher ``version``) is a ``NewerFormatError`` that says
so; the best-effort readers (ranks, rank health) skip such a file as they skip a torn one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_tool.core import run_catalog as catalog
from ckpt_tool.core.index import parse_records
from ckpt_tool.core.timeouts import DurationLog
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.store.durable import append_line, atomic_write, replace_quietly

EVENTS_NAME = catalog.EVENTS_NAME
HEALTH_NAME = catalog.HEALTH_NAME
ROUND_END_NAME = catalog.ROUND_END_NAME
TIMEOUTS_NAME = catalog.TIMEOUTS_NAME

_NOT_A_RUN_DIR = "pass a checkpoint directory (its run/ is used) or a run directory holding events.jsonl"


# ----------------------------------------------------------------------------- events.jsonl


def note(run_dir: Path, event: str, **data: Any) -> dict[str, Any]:
    """Append ``event`` with its fields to ``RUN_DIR/events.jsonl`` (fsynced) and return the
    record. ``event`` must be in ``core.run_catalog.RUN_EVENTS`` or be ``user.NAME``: anything
    else is a ``CkptError`` (exit 2) and nothing is written."""
    catalog.check_event_name(event)
    record = {"time": time.time(), "event": event, **data}
    run_dir.mkdir(parents=True, exist_ok=True)
    append_line(run_dir / EVENTS_NAME, json.dumps(record, sort_keys=True, default=str) + "\n")
    return record


def load_events(run_dir: Path) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
    """The run's events, and the numbers of the lines that are not events (torn, garbage).
    A run directory that is a file or not readable is a ``CkptError`` (exit 2), not a traceback."""
    try:
        with open(run_dir / EVENTS_NAME, encoding="utf-8", errors="replace") as f:
            return parse_records(f)
    except FileNotFoundError:
        if run_dir.exists() and not run_dir.is_dir():
            raise CkptError(f"{run_dir} is a file, not a run directory", _NOT_A_RUN_DIR, ExitCode.USAGE) from None
        return [], ()
    except NotADirectoryError:
        raise CkptError(f"{run_dir} is not a directory", _NOT_A_RUN_DIR, ExitCode.USAGE) from None
    except PermissionError:
        raise CkptError(
            f"permission denied reading {run_dir / EVENTS_NAME}",
            "run as the user who owns the run, or ask them to grant read access",
            ExitCode.USAGE,
        ) from None


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """``load_events`` without the skipped lines."""
    return load_events(run_dir)[0]


def events_size(run_dir: Path) -> int:
    """The size of ``events.jsonl`` in bytes (0 when absent): an offset for ``read_events_after``."""
    try:
        return (run_dir / EVENTS_NAME).stat().st_size
    except OSError:
        return 0


def read_events_after(run_dir: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The events appended after byte ``offset``, and the offset to read from next time: a line
    still being written (no newline yet) is left for the next read; torn lines are skipped. For a
    watcher that polls (``ckpt job`` waiting for a round's nodes): it never rereads the whole log."""
    try:
        with open(run_dir / EVENTS_NAME, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    return parse_records(whole.decode("utf-8", errors="replace").splitlines())[0], offset + len(whole)


# ----------------------------------------------------------------------------- the JSON files


def _write(path: Path, data: Mapping[str, Any], durable: bool = True) -> None:
    body = (json.dumps(catalog.stamped(path.name, data), indent=1) + "\n").encode()
    (atomic_write if durable else replace_quietly)(path, body)


def _read(path: Path) -> dict[str, Any] | None:
    """The file's object, checked for its version; None when it is absent, unreadable or torn
    (a writer replaces it whole, so a torn one was written by hand or by a dying disk)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return catalog.check_version(path.name, data, str(path))


def write_health(run_dir: Path, ledger: Mapping[str, Any]) -> None:
    """``health.json``: the ledger's latest fold (``core.node_ledger.HealthLedger.to_json``), with the time."""
    _write(run_dir / HEALTH_NAME, {"time": time.time(), **ledger})


def read_health(run_dir: Path) -> dict[str, Any] | None:
    """``health.json`` as written, or None when there is none (yet)."""
    return _read(run_dir / HEALTH_NAME)


def write_round_end(run_dir: Path, round_id: str, suspects: list[str], by: str, checkpoint_first: bool) -> None:
    """``round_end.json``: round ``round_id`` ends on every node (``by`` found ``suspects``)."""
    record = {"round": round_id, "suspects": suspects, "by": by, "time": time.time(), "checkpoint_first": checkpoint_first}
    _write(run_dir / ROUND_END_NAME, record)


def read_round_end(run_dir: Path) -> dict[str, Any] | None:
    """``round_end.json`` as written (any round), or None."""
    return _read(run_dir / ROUND_END_NAME)


def write_timeouts(run_dir: Path, durations: DurationLog, timeouts: Mapping[str, float]) -> None:
    """``timeouts.json``: the phase durations observed and the timeouts calibrated from them."""
    _write(run_dir / TIMEOUTS_NAME, {"durations": durations.to_json(), "timeouts": dict(timeouts)})


def read_timeouts(run_dir: Path) -> DurationLog | None:
    """The phase durations of ``timeouts.json``, or None when it has none (yet) or is torn."""
    data = _read(run_dir / TIMEOUTS_NAME)
    return DurationLog.from_json(data.get("durations")) if data is not None else None


def write_ranks(run_dir: Path, node: str, attempt: int, ranks: Mapping[int, int], round_id: str = "", probe: str = "") -> None:
    """``ranks.NODE.json``: the pid of each rank of this node's current attempt (a rank that
    started warm runs in a spare process, not below torchrun), the round, and the address where
    this node's watchdog answers its peers' reachability probes. Best effort: an error is ignored."""
    record = {"node": node, "attempt": attempt, "round": round_id, "probe": probe, "time": time.time(),
              "ranks": {str(r): p for r, p in sorted(ranks.items())}}  # fmt: skip
    _write(run_dir / catalog.RANKS_PATTERN.format(node=node), record, durable=False)


def _each(run_dir: Path, pattern: str) -> list[dict[str, Any]]:
    """Every node's file of ``pattern``, oldest name first; a torn or newer file is skipped."""
    out = []
    for path in sorted(run_dir.glob(pattern.format(node="*"))):
        try:
            data = _read(path)
        except CkptError:
            continue  # a newer ckpt-tool's: informs, nothing depends on it
        if data is not None:
            out.append(data)
    return out


def read_ranks(run_dir: Path, newest_round: bool = False) -> dict[int, int]:
    """Rank -> pid from every node's ``ranks.NODE.json`` (``newest_round``: only the files of the
    round written last: a node left behind keeps its old file); {} when there is none (yet)."""
    out: dict[int, int] = {}
    files = _each(run_dir, catalog.RANKS_PATTERN)
    if newest_round and files:
        newest = max(files, key=lambda d: d.get("time", 0) if isinstance(d.get("time"), (int, float)) else 0).get("round")
        files = [d for d in files if d.get("round") == newest]
    for data in files:
        try:
            out.update({int(r): int(p) for r, p in data["ranks"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def read_probes(run_dir: Path, round_id: str) -> dict[str, str]:
    """Node -> the address of its watchdog's probe listener, for the nodes of round ``round_id``."""
    out = {}
    for data in _each(run_dir, catalog.RANKS_PATTERN):
        if data.get("round") == round_id and isinstance(data.get("probe"), str) and data["probe"] and isinstance(data.get("node"), str):
            out[data["node"]] = data["probe"]
    return out


def write_links(run_dir: Path, node: str, round_id: str, rates: Mapping[str, float]) -> None:
    """``links.NODE.json``: bytes/s this node's watchdog sent to each peer's (a link check). Best effort."""
    record = {"node": node, "round": round_id, "time": time.time(), "rates": dict(rates)}
    _write(run_dir / catalog.LINKS_PATTERN.format(node=node), record, durable=False)


def read_links(run_dir: Path, round_id: str, since: float) -> dict[str, dict[str, float]]:
    """Node -> {peer: bytes/s} from the link checks of round ``round_id`` written since ``since``."""
    out = {}
    for data in _each(run_dir, catalog.LINKS_PATTERN):
        try:
            if data.get("round") == round_id and float(data["time"]) >= since:
                out[str(data["node"])] = {str(k): float(v) for k, v in data["rates"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def write_rank_health(run_dir: Path, node: str, table: Mapping[str, Any]) -> None:
    """``rank_health.NODE.json``: this node's ranks' standing (``RankHealth.table``). Best effort."""
    _write(run_dir / catalog.RANK_HEALTH_PATTERN.format(node=node), table, durable=False)


_NUMBERS = ("step", "wall_s", "compute_s", "wait_s", "score", "individual")


def read_rank_health(run_dir: Path) -> list[dict[str, Any]]:
    """Every node's last written standing (for ``ckpt status``), rows with their node. A file or
    row that is not what a watchdog writes (hand-edited, truncated, newer) is skipped."""
    rows = []
    for data in _each(run_dir, catalog.RANK_HEALTH_PATTERN):
        try:
            node, as_of = str(data["node"]), float(data["time"])
            ranks = list(data["ranks"])
        except (ValueError, KeyError, TypeError):
            continue
        for r in ranks:
            if isinstance(r, dict) and type(r.get("rank")) is int and all(isinstance(r.get(k), (int, float)) for k in _NUMBERS):
                rows.append({**r, "node": node, "as_of": as_of})
    return sorted(rows, key=lambda r: r["rank"])


# ----------------------------------------------------------------------------- hangs/ and stacks_request.json


def open_hang_dir(run_dir: Path, round_id: str, by: str, join_within_s: float = 0.0) -> tuple[Path, bool]:
    """The ``hangs/<id>/`` directory for the stacks of a hang (or a ``ckpt stacks`` request) and
    whether this call opened it: a request of the same round younger than ``join_within_s``
    (another node found the same hang first) is joined; else a new directory is made and
    ``stacks_request.json`` asks every node's watchdog for its ranks' stacks (round ``*``: any).
    Two nodes that find a hang at once agree on one directory (a lock in ``hangs/``)."""
    from filelock import FileLock

    hangs = run_dir / catalog.HANGS_DIR
    hangs.mkdir(parents=True, exist_ok=True)
    with FileLock(str(hangs / ".lock"), timeout=10):
        request = read_stacks_request(run_dir)
        if request is not None and request.get("round") == round_id and time.time() - float(request.get("time", 0)) <= join_within_s:
            found = hangs / str(request.get("dir"))
            if found.is_dir():
                return found, False
        now = time.time()
        name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}-{_safe(by)}"
        (hangs / name).mkdir()
        _write(run_dir / catalog.STACKS_REQUEST_NAME, {"dir": name, "round": round_id, "by": by, "time": now})
    return hangs / name, True


def read_stacks_request(run_dir: Path) -> dict[str, Any] | None:
    """``stacks_request.json``: the newest request for the ranks' stacks, or None."""
    try:
        return _read(run_dir / catalog.STACKS_REQUEST_NAME)
    except CkptError:
        return None


def write_hang_report(hang_dir: Path, report: Mapping[str, Any]) -> None:
    """``hangs/<id>/report.json``: the culprit(s), the victims, each rank's verdict."""
    _write(hang_dir / catalog.HANG_REPORT_NAME, {"time": time.time(), **report})


def read_hang_reports(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every hang directory with its report, oldest first (a directory without one is skipped)."""
    out = []
    for d in sorted((run_dir / catalog.HANGS_DIR).glob("*/")):
        try:
            data = _read(d / catalog.HANG_REPORT_NAME)
        except CkptError:
            continue
        if data is not None:
            out.append((d, data))
    return out


def write_reach(hang_dir: Path, node: str, reach: Mapping[str, bool]) -> None:
    """``hangs/<id>/reach.NODE.json``: which peers this node's watchdog reached when it wrote its stacks."""
    replace_quietly(hang_dir / f"reach.{_safe(node)}.json", (json.dumps({"node": node, "reach": dict(reach)}) + "\n").encode())


def read_reach(hang_dir: Path) -> dict[str, dict[str, bool]]:
    """Node -> {peer: reached} from every ``reach.NODE.json`` of a hang directory."""
    out = {}
    for p in sorted(hang_dir.glob("reach.*.json")):
        try:
            data = json.loads(p.read_text())
            out[str(data["node"])] = {str(k): bool(v) for k, v in data["reach"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def read_rank_stacks(hang_dir: Path) -> list[str]:
    """The text of every ``rank_R.txt`` of a hang directory, by rank."""

    def rank_of(p: Path) -> int:
        try:
            return int(p.stem.removeprefix("rank_"))
        except ValueError:
            return -1

    out = []
    for p in sorted(hang_dir.glob("rank_*.txt"), key=rank_of):
        try:
            out.append(p.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40] or "node"


# ----------------------------------------------------------------------------- command.json


def write_command(run_dir: Path, command: list[str], cwd: str, nproc_per_node: int) -> None:
    """``command.json``: the training command ``ckpt run`` runs (``ckpt replay`` runs it again)."""
    _write(run_dir / catalog.COMMAND_NAME, {"command": list(command), "cwd": cwd, "nproc_per_node": nproc_per_node}, durable=False)


def read_command(run_dir: Path) -> dict[str, Any] | None:
    """``command.json`` as written, or None (a run from before it, or torn)."""
    return _read(run_dir / catalog.COMMAND_NAME)


# ----------------------------------------------------------------------------- anomaly.json and metrics/


def write_anomaly(run_dir: Path, record: Mapping[str, Any]) -> None:
    """``anomaly.json``: the last anomaly, ``replaying`` or ``done`` (fsynced: the restarted ranks read it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    _write(run_dir / catalog.ANOMALY_NAME, {"time": time.time(), **record})


def read_anomaly(run_dir: Path) -> dict[str, Any] | None:
    """``anomaly.json`` as written, or None (none yet, or torn)."""
    return _read(run_dir / catalog.ANOMALY_NAME)


def metrics_path(run_dir: Path, rank: int) -> Path:
    """``metrics/rank_R.jsonl`` of ``rank``."""
    return run_dir / catalog.METRICS_DIR / catalog.METRICS_PATTERN.format(rank=rank)


class MetricsRecord:
    """One rank's ``metrics/rank_R.jsonl``, appended a line a step (buffered: ``flush`` at a save, a
    replay and the end). A directory that cannot be written turns the record off, with a warning
    from the caller: the training goes on without it."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = metrics_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def append(self, step: int, values: Mapping[str, float]) -> None:
        """One line: the step and the rank's values (json writes floats with repr: exact)."""
        self._f.write(json.dumps({"step": step, "values": dict(values)}) + "\n")

    def flush(self) -> None:
        """Hand the buffered lines to the file system."""
        self._f.flush()

    def close(self) -> None:
        """Flush and close."""
        self._f.close()


_TAIL_CHUNK = 1 << 16


def recent_metrics(run_dir: Path, rank: int, after: int, until: int | None = None) -> dict[int, dict[str, float]]:
    """``rank``'s recorded values of the steps after ``after`` (and up to ``until``), the newest line
    of each step (a restart appends steps again), read from the end of the file back to a line at
    or before ``after``: a week of steps is not read at every restart. A torn line is skipped."""
    path = metrics_path(run_dir, rank)
    try:
        f = open(path, "rb")
    except OSError:
        return {}
    out: dict[int, dict[str, float]] = {}
    with f:
        end = f.seek(0, 2)
        pos, rest, reached = end, b"", False
        while pos > 0 and not reached:
            start = max(0, pos - _TAIL_CHUNK)
            f.seek(start)
            block = f.read(pos - start) + rest
            pos = start
            lines = block.split(b"\n")
            rest = lines.pop(0) if pos > 0 else b""  # a line cut by the chunk's start: read with the next chunk
            for line in reversed(lines):
                try:
                    d = json.loads(line)
                    step, values = int(d["step"]), {str(k): float(v) for k, v in d["values"].items()}
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if step <= after:
                    reached = True
                    break
                if (until is None or step <= until) and step not in out:
                    out[step] = values
    return out
