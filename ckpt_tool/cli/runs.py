"""``ckpt status / history``: what happened to a run, from its run directory (``CKPT_DIR/run``),
its checkpoint index and SLURM. Parse, read, print."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from ckpt_tool.cli.options import JsonTextOpt
from ckpt_tool.cli.output import Column, err, escape, out, print_json, print_table, shorten
from ckpt_tool.cli.targets import locate
from ckpt_tool.core.node_ledger import fold_health
from ckpt_tool.core.run_catalog import FINAL_EVENTS
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.supervise.run_dir import EVENTS_NAME, read_rank_health


def _skipped_note(run_dir: Path, skipped: tuple[int, ...]) -> str | None:
    from ckpt_tool.core.index import EventLog

    return EventLog((), skipped).skipped_note(str(run_dir / EVENTS_NAME))


def _job_or_dir(target: str) -> tuple[Path, Path | None, str | None, list[str]]:
    """(run directory, checkpoint directory or None, the job id given or None, notes) from a job
    id (found through scontrol: the job's batch script or Command=) or a directory. A number that
    names an existing directory is that directory."""
    from ckpt_tool.slurm.commands import job_state
    from ckpt_tool.slurm.job_lookup import JobForgotten, find_job_run

    if not target.isdigit() or Path(target).exists():
        run_dir, ckpt_dir = locate(Path(target))
        return run_dir, ckpt_dir, None, []
    try:
        found = find_job_run(target)
    except JobForgotten as exc:
        state = job_state(target)  # sacct -c may still know how it ended
        if state is None:
            raise CkptError(
                f"SLURM knows no job {target}",
                "it may have ended before MinJobAge (`sacct -c` keeps finished jobs only with jobcomp): "
                "pass the --ckpt-dir of the run instead: ckpt status CKPT_DIR",
                ExitCode.NOT_FOUND,
            ) from None
        raise CkptError(f"job {target} ended ({state.state}, says {state.source}); {exc.message}", exc.hint, exc.exit_code) from None
    return found.run_dir, found.ckpt_dir, target, [f"job {target}'s run directory {found.run_dir} (from {found.found_in})"]


def read_timeline(run_dir: Path, ckpt_dir: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(the run's own events as read, the run's events and its checkpoint index's merged oldest
    first with ``source`` saying which, notes on lines that could not be read): one read of each log
    for ``ckpt status``, ``ckpt history`` and ``ckpt plan --run-dir``."""
    from ckpt_tool.store.store import CheckpointStore
    from ckpt_tool.supervise.run_dir import load_events

    records, skipped = load_events(run_dir)
    timeline = [{"source": "run", **e} for e in records]
    notes = [n for n in [_skipped_note(run_dir, skipped)] if n]
    if ckpt_dir is not None and ckpt_dir.is_dir() and (ckpt_dir / "index.jsonl").exists():
        log = CheckpointStore(ckpt_dir).event_log()
        timeline += [{"source": "checkpoints", "time": e.time, "event": e.event, **e.data} for e in log.events]
        notes += [n for n in [log.skipped_note(str(ckpt_dir / "index.jsonl"))] if n]
    timeline.sort(key=lambda e: e["time"])
    return records, timeline, notes


LIVE_STATES = frozenset({"RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"})


def _print_account(acct: Any, detail: bool) -> None:
    """The account's line (``3 interruptions, ... ETTR 96.8%``), where the time went, and with
    ``detail`` one row per interruption."""
    from ckpt_tool.core.account import KINDS, WORDS, duration

    out.print(f"[bold]{escape(acct.summary())}[/]")
    totals = acct.totals()
    wall = acct.wall_s or 1.0
    spent = [f"{WORDS[k]} {duration(totals[k])} ({totals[k] / wall:.1%})" for k in KINDS if totals[k] > 0]
    out.print(f"  {duration(acct.wall_s)} of wall time: " + escape("; ".join(spent)))
    if not detail or not acct.interruptions:
        return
    print_table(
        [Column("#"), Column("time"), Column("what"), Column("step"), Column("went on from"), Column("steps redone"),
         Column("down"), Column("of which"), Column("then")],
        [
            (
                i.index + 1,
                time.strftime("%m-%d %H:%M:%S", time.localtime(i.time)),
                i.label,
                i.step if i.step is not None else "-",
                i.resumed_from if i.resumed_from is not None else "-",
                i.steps_recomputed,
                duration(i.down_s),
                ", ".join(f"{k} {duration(v)}" for k, v in i.seconds.items() if v > 0) or "-",
                "; ".join(i.then) or "-",
            )
            for i in acct.interruptions
        ],
        title="interruptions (down: no training; recompute: the steps redone after it)",
    )  # fmt: skip


def status(
    target: str = typer.Argument(..., metavar="TARGET", help="A job id, a checkpoint directory or a run directory.", show_default=False),
    as_json: bool = JsonTextOpt,
) -> None:
    """Job state, restarts and requeues so far, newest checkpoint and its age, last events."""
    from ckpt_tool.core.account import account
    from ckpt_tool.core.history import last_anomaly
    from ckpt_tool.slurm.commands import job_state
    from ckpt_tool.store.store import CheckpointStore

    report: dict[str, Any] = {}
    run_dir, ckpt_dir, job_id, found = _job_or_dir(target)
    events, timeline, notes = read_timeline(run_dir, ckpt_dir)
    if job_id is None:
        ids = [e.get("job_id") for e in events if e.get("job_id")]
        job_id = str(ids[-1]) if ids else None
    report["run_dir"] = str(run_dir)
    if found:
        report["found"] = found[0]
    if ckpt_dir is not None:
        store = CheckpointStore(ckpt_dir)
        latest = store.latest_or_none()
        report["newest_checkpoint"] = latest
        if latest is not None:
            try:
                report["checkpoint_age_s"] = round(time.time() - store.read_manifest(latest).created_at, 1)
            except CkptError as exc:
                notes.append(f"newest checkpoint: {exc.message}")
    state = job_state(job_id) if job_id else None
    report["job_id"] = job_id
    report["job_state"] = state.state if state else None
    report["slurm_restarts"] = state.restarts if state else None
    job_events = [e for e in events if str(e.get("job_id", job_id)) == str(job_id)] if job_id else events
    report["starts"] = sum(1 for e in job_events if e["event"] == "job_start")
    report["requeues"] = sum(1 for e in events if e["event"] == "requeue")
    # every node's `ckpt run` logs a restart of its ranks: count each group restart once
    report["in_allocation_restarts"] = len(
        {(e.get("round"), e.get("attempt"), e.get("node") is None) for e in events if e["event"] == "restarted"}
    )
    report["health"] = fold_health(events).to_json()
    report["ranks"] = read_rank_health(run_dir)
    finals = [e["event"] for e in events if e["event"] in FINAL_EVENTS]
    report["final"] = finals[-1] if finals else None
    hangs = [e for e in events if e["event"] == "hang_report"]
    report["last_hang"] = (
        {k: hangs[-1].get(k) for k in ("time", "summary", "culprits", "culprit_nodes", "attributed", "stacks")} if hangs else None
    )
    report["last_anomaly"] = last_anomaly(events)
    report["last_events"] = events[-8:]
    report["notes"] = notes
    acct = account(timeline, now=time.time() if report["job_state"] in LIVE_STATES else None)
    report["account"] = acct.to_json() if acct is not None else None
    if as_json:
        print_json(report)
        return
    if acct is not None:
        _print_account(acct, detail=False)
    out.print(
        f"job [bold]{escape(report['job_id'] or '-')}[/]: {escape(report['job_state'] or 'unknown')}  starts {report['starts']}  requeues {report['requeues']}  restarts in allocation {report['in_allocation_restarts']}"
    )
    if "newest_checkpoint" in report:
        age = report.get("checkpoint_age_s")
        out.print(
            f"newest checkpoint: {'step ' + str(report['newest_checkpoint']) if report['newest_checkpoint'] is not None else 'none yet'}"
            + (f" ({age:.0f} s old)" if age is not None else "")
        )
    if "found" in report:
        out.print(f"run directory: {escape(report['found'])}")
    if report["final"]:
        out.print(f"final state: [bold]{report['final']}[/]")
    if report["last_hang"]:
        h = report["last_hang"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["time"]))
        out.print(f"last hang ({when}): {escape(str(h['summary']))}")
        out.print(f"  stacks: {escape(str(h['stacks']))}  (every rank's; `ckpt stacks {escape(str(run_dir))}` asks a live job again)")
    if report["last_anomaly"]:
        a = report["last_anomaly"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["time"]))
        out.print(f"last wrong value ({when}): {escape(str(a['message']))}")
        out.print(f"  values: {escape(str(run_dir / 'metrics'))}/rank_R.jsonl  (each rank's, a line a step)")
    _print_roster(report["health"])
    _print_health(report["health"])
    _print_ranks(report["ranks"])
    for e in report["last_events"]:
        out.print(f"  {time.strftime('%H:%M:%S', time.localtime(e['time']))} {escape(_details(e, e['event'] + ' '))}")
    for text in notes:
        err.print(f"[yellow]note:[/] {escape(text)}")


def _print_roster(health: dict[str, Any]) -> None:
    """Which nodes train, which stand by (hot spares), which a standby replaced and which were left
    behind: printed when the job has standbys or has left a node behind (a plain job: nothing)."""
    if not (health["standby"] or health["replaced"] or health["left_behind"]):
        return
    out.print(
        f"nodes: active {escape(','.join(health['active']) or '-')}  standby {escape(','.join(health['standby']) or '-')}"
        f"  left behind {escape(','.join(health['left_behind']) or '-')}"
    )
    for r in health["replaced"]:
        out.print(f"  replaced {escape(r['node'])} with {escape(r['by'])} ({escape(r['reason'])})")


def _print_health(health: dict[str, Any]) -> None:
    """The node ledger, when a node has failed, straggled, been flagged or left behind (all quiet: nothing)."""
    rows = [n for n in health["nodes"] if n["failures_total"] or n["left_behind"] or n["stragglers"] or n["flagged"]]
    if not rows:
        return
    print_table(
        [
            Column("node"),
            Column("in a row"),
            Column("total"),
            Column("last failure"),
            Column("stragglers"),
            Column("suspect for"),
            Column("left behind"),
        ],
        [
            (
                n["node"],
                n["failures_in_a_row"],
                n["failures_total"],
                shorten(n["last_reason"] or "-", 90),
                f"{n['stragglers']}: {shorten(n['last_straggler'], 60)}" if n["stragglers"] else "-",
                n["flagged"] or "-",
                n["left_behind"] or "-",
            )
            for n in health["nodes"]
        ],
        title=f"node health (suspect after {health['suspect_after']} failures in a row, or a GPU error)",
    )


_RANK_COLUMNS = {"rank": "rank", "node": "node", "step": "step", "step s": "wall_s", "compute s": "compute_s", "wait s": "wait_s"}
_RANK_COLUMNS |= {"score": "score", "vs own best": "individual", "GPU %": "gpu_util", "flag": "flag"}


def _print_ranks(ranks: list[dict[str, Any]]) -> None:
    """Each rank's standing from its node's watchdog: medians over the last steps."""
    if not ranks:
        return
    as_of = time.strftime("%H:%M:%S", time.localtime(max(r["as_of"] for r in ranks)))
    rows = [{**r, "flag": f"straggler ({r.get('worst')})" if r.get("straggler") else ""} for r in ranks]
    print_table(
        [Column(title, key=key) for title, key in _RANK_COLUMNS.items()],
        [tuple(r.get(key, "-") for key in _RANK_COLUMNS.values()) for r in rows],
        title=f"ranks (medians of the last steps; score: peers' median / own time, 1 = not slower; as of {as_of})",
    )


def _details(e: dict[str, Any], prefix: str = "") -> str:
    from ckpt_tool.core.history import details

    return prefix + details(e)


def history(
    target: str = typer.Argument(..., metavar="TARGET", help="A job id, a checkpoint directory or a run directory.", show_default=False),
    plot: Path | None = typer.Option(
        None, "--plot", help="Also draw the story here (PNG, SVG, PDF, JPEG: by the suffix): the loss by step, every event marked."
    ),
    metrics: Path | None = typer.Option(
        None, "--metrics", help="With --plot: the training's JSON-lines metrics (step, loss) for the curve."
    ),
    since: str | None = typer.Option(
        None, "--since", help="Only events since a duration ago (30m, 2h, 1d) or a local time ('2026-12-03 10:00').", show_default=False
    ),
    until: str | None = typer.Option(
        None, "--until", help="Only events up to a duration ago (30m, 2h) or a local time ('2026-12-03 12:00').", show_default=False
    ),
    event: list[str] = typer.Option(
        [], "--event", help="Only events of this name (repeat for several: --event commit --event hang).", show_default=False
    ),
    last: int | None = typer.Option(
        None, "--last", min=1, help="Only the newest N events (after --since and --event).", show_default=False
    ),
    as_json: bool = JsonTextOpt,
) -> None:
    """The run's timeline: saves, failures, restarts, requeues and rollbacks (and a picture of it: --plot)."""
    from ckpt_tool.core.account import account
    from ckpt_tool.core.history import KNOWN_EVENTS, parse_since, select, unknown_events

    now = time.time()
    start = parse_since(since, now) if since is not None else None
    stop = parse_since(until, now, "--until") if until is not None else None
    if start is not None and stop is not None and stop < start:
        raise CkptError(
            f"--until {until!r} is before --since {since!r}: no time between them",
            "give --since the earlier time, e.g. --since 2h --until 1h",
            ExitCode.USAGE,
        )
    if plot is not None:
        from ckpt_tool.ops.plot import check_target

        check_target(plot)  # a directory, a missing parent, a suffix that names no format: before any work

    run_dir, ckpt_dir, _, found = _job_or_dir(target)
    _, timeline, read_notes = read_timeline(run_dir, ckpt_dir)
    notes = found + read_notes
    if not timeline:
        raise CkptError(f"no events found for {target}", "pass the --ckpt-dir of the run (or its run/ directory)", ExitCode.NOT_FOUND)
    unknown = unknown_events(event, timeline)
    if unknown:
        raise CkptError(
            f"--event {', '.join(unknown)}: no such event",
            "known events: " + ", ".join(sorted(set(KNOWN_EVENTS) | {str(e["event"]) for e in timeline})),
            ExitCode.USAGE,
        )
    whole = timeline
    acct = account(whole)
    if acct is not None and (start is not None or stop is not None):
        acct = acct.window(start, stop)
    timeline = select(whole, start, event, last, stop)
    if len(timeline) < len(whole):
        notes.append(f"{len(timeline)} of {len(whole)} events shown (--since/--until/--event/--last)")
        if acct is not None and (start is not None or stop is not None):
            notes.append("the account covers the time between --since and --until only")
    if metrics is not None and plot is None:
        raise CkptError("--metrics draws the loss curve of --plot", "add --plot PATH.png", ExitCode.USAGE)
    if plot is not None:
        from ckpt_tool.core.history import story
        from ckpt_tool.ops.plot import draw, read_metrics

        told = story(timeline, read_metrics(metrics) if metrics is not None else None)
        draw(told, plot, f"{target}", acct)
        notes.append(f"picture written to {plot}")
    if as_json:
        print_json(
            {
                "account": acct.to_json() if acct is not None else None,
                "events": timeline,
                "notes": notes,
                **({"plot": str(plot)} if plot is not None else {}),
            }
        )
        return
    if acct is not None:
        _print_account(acct, detail=True)
    styles = {
        "hang": "red",
        "rank_exited": "red",
        "quarantine": "red",
        "crash_loop": "red",
        "fatal": "red",
        "job_failed": "red",
        "round_ended": "red",
        "nodes_left_behind": "red",
        "shrunk": "yellow",
        "replaced": "yellow",
        "straggler": "yellow",
        "gpu_idle": "yellow",
        "gpu_error": "red",
        "round_ending": "yellow",
        "excluded": "yellow",
        "requeue": "yellow",
        "restarted": "yellow",
        "rollback": "yellow",
        "commit": "green",
    }
    print_table(
        [
            Column(
                "time",
                terminal=lambda t: time.strftime("%m-%d %H:%M:%S", time.localtime(t)),
                full=lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)),
            ),
            Column("source"),
            Column("event", styles=styles),
            Column("details", terminal=str, full=str),  # wrapped on a terminal, never cut: a failure's reason is all there
        ],
        [(e["time"], e["source"], e["event"], _details(e)) for e in timeline],
        title=f"history of {target}",
    )
    for text in notes:
        err.print(f"[yellow]note:[/] {escape(text)}")


def stacks(
    target: str = typer.Argument(..., metavar="TARGET", help="A job id, a checkpoint directory or a run directory.", show_default=False),
    wait: float = typer.Option(10.0, "--wait", min=1.0, help="Seconds to wait for the ranks' answers."),
    as_json: bool = JsonTextOpt,
) -> None:
    """Every rank's Python stacks (all threads) from a live job under `ckpt run`, and who looks stuck.

    Each node's watchdog writes its ranks' stacks into RUN_DIR/hangs/<id>/rank_R.txt (a rank blocked
    in a collective answers too; a frozen one is read with py-spy when installed); the training goes on.
    """
    from ckpt_tool.core.hang_report import analyse, moving, parse_rank_file
    from ckpt_tool.supervise.run_dir import read_ranks, read_reach, write_hang_report
    from ckpt_tool.supervise.stacks import request

    run_dir, _, _, notes = _job_or_dir(target)
    if not (run_dir / EVENTS_NAME).exists():
        raise CkptError(
            f"{run_dir} has no events.jsonl: no job ran under `ckpt run` there",
            "pass the --ckpt-dir of a run started with ckpt run or ckpt submit",
            ExitCode.NOT_FOUND,
        )
    expected = len(read_ranks(run_dir, newest_round=True))  # not the ranks of a node left behind
    try:
        hang_dir, texts = request(run_dir, expected, wait)
    except OSError as exc:
        raise CkptError(
            f"cannot write the request for stacks into {run_dir}: {exc.strerror or exc}",
            "run ckpt stacks as the job's user, where the run directory is writable (the watchdogs read the request there)",
            ExitCode.USAGE,
        ) from None
    if not texts:
        raise CkptError(
            f"no rank answered in {wait:g} s",
            f"is the job running under `ckpt run`? `ckpt status {run_dir}` shows its state; a rank frozen (SIGSTOP) answers only to "
            "py-spy on its node (pip install ckpt-tool[stacks])",
            ExitCode.NOT_FOUND,
        )
    ranks = [r for r in map(parse_rank_file, texts) if r is not None]
    report = analyse(ranks, max(expected, len(ranks)) or None, read_reach(hang_dir))
    data = {**report.to_json(), "stacks": str(hang_dir), "requested": True, "moving": moving(ranks) is not None}
    write_hang_report(hang_dir, data)
    if as_json:
        print_json(data)
        return
    for text in notes:
        err.print(f"[yellow]note:[/] {escape(text)}")
    print_table(
        [Column("rank"), Column("node"), Column("step"), Column("phase"), Column("where"), Column("waiting in"), Column("answered")],
        [
            (
                v.rank,
                v.node,
                v.step if v.step is not None else "-",
                v.phase,
                shorten(v.where + (f"  {v.code}" if v.code else ""), 80),
                v.waiting_in or "-",
                v.answered or f"no: {v.note}",
            )
            for v in report.verdicts
        ],  # fmt: skip
        title=f"stacks of {len(ranks)} rank(s)" + (f" (missing: {', '.join(map(str, report.missing))})" if report.missing else ""),
    )
    quiet = moving(ranks)
    if quiet is not None:
        out.print(f"moving: every rank beat in the last {quiet:.1f} s (a snapshot; nobody is stuck)")
    elif report.attributed:
        out.print(f"the others wait for: {escape(report.summary())}")
    else:
        out.print(f"nobody stands out: {escape(report.reason)}")
    out.print(f"stacks: {escape(str(hang_dir))}")
