"""``ckpt run``: torchrun under a watchdog that finds crashes and hangs in seconds.

torchrun does what it does well: it starts the ranks, notices one that exits, restarts the
whole group (``--max-restarts``) and, across nodes, coordinates the restart through its
rendezvous. The watchdog adds what torchrun lacks:

- **hangs**: ranks beat on a node-local channel with their step and phase; a rank silent for
  longer than its phase's calibrated timeout is explained, then killed: every rank's stacks are
  written to ``RUN_DIR/hangs/<id>/`` (``supervise.stacks``; other nodes add theirs on the
  request), the culprit is named (``core.hang_report``) and blamed in the health ledger, and the
  kill (SIGKILL for the culprit, SIGTERM then SIGKILL for the others) turns the hang into a
  failure torchrun sees and restarts from the newest checkpoint;
- **crash loops**: ``crash_loop`` failures in a row without a new checkpoint stop the job;
- **a node that keeps failing**: every rank exit is logged with its node and cause (its own
  crash, a kill, a hang, or a victim of a peer's failure); after each failure the health ledger
  (``supervise.round_end``) is folded from the run's events, and when a node of this round is
  suspect every node's ``ckpt run`` ends the round (exit 77) so that the batch script can leave
  that node behind;
- **preemption**: SIGUSR1 or SIGTERM asks the ranks (on the channel, not by torchrun's signal
  forwarding) to checkpoint at the next step and stop; the exit status says "requeue me";
- **restarts without imports**: a pre-warmed spare per local rank takes the next rank over
  (``supervise.warm_pool``); the ranks left after a failure are ended at once, not waited for;
- **stragglers and GPUs** (``supervise.rank_vitals``): a rank that stays slower than its peers,
  a GPU idle while its peers work, a GPU hardware error; a node suspect while the training goes
  on (a GPU error; a straggler with ``--straggler-suspect``) ends the round after a checkpoint;
- an event log (``events.jsonl``) and phase durations (``timeouts.json``) in the run directory.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckpt_tool.core.hang_report import HangReport, analyse, parse_rank_file
from ckpt_tool.core.run_catalog import HANGS_DIR
from ckpt_tool.core.stop_purpose import stop_purpose, stopped_note
from ckpt_tool.core.supervision import Beat, CrashLoopBreaker, beat_of, find_hangs
from ckpt_tool.core.timeouts import DurationLog, calibrate
from ckpt_tool.errors import ExitCode
from ckpt_tool.store.store import newest_step
from ckpt_tool.supervise import channel, peer_links, round_end, stacks
from ckpt_tool.supervise.gpu_monitor import open_reader
from ckpt_tool.supervise.peer_links import LinkCheck, PeerLinks
from ckpt_tool.supervise.processes import alive, end_launcher, ignore_job_signals, kill_tree, started_at
from ckpt_tool.supervise.rank_reports import LOGGED, RankReports
from ckpt_tool.supervise.rank_vitals import RankHealth
from ckpt_tool.supervise.run_config import RunConfig, rank_environment, torchrun_argv
from ckpt_tool.supervise.run_dir import (
    note,
    open_hang_dir,
    read_probes,
    read_rank_stacks,
    read_reach,
    read_stacks_request,
    read_timeouts,
    write_command,
    write_hang_report,
    write_ranks,
    write_reach,
    write_timeouts,
)
from ckpt_tool.supervise.warm_pool import WarmPool

__all__ = ["RunConfig", "Watchdog", "torchrun_argv"]

# After a rank of this node failed, every node logs its exits within about 1.5 s (measured: the
# culprit's crash, then its peers' failed collectives): judge the nodes once that has settled,
# not only when the next attempt's ranks beat (~10 s later, after rendezvous and imports).
JUDGE_AFTER_S = 3.0
# The ranks left when one of their attempt died or hung can do nothing useful (their collectives
# fail): SIGTERM, SIGKILL this long after. A commit past its last collective (rank 0 renaming the
# manifest) ends in ms; their own exit (traceback, ~1 s of teardown with torch) delays the restart.
TEARDOWN_GRACE_S = 0.5
# A hang's stacks: another node that finds the same hang within this long joins its directory;
# the node waits this long for the other nodes' ranks' files before it judges without them.
JOIN_HANG_WITHIN_S = 30.0
JOIN_WAIT_S = 3.0
STACKS_POLL_S = 0.5  # how often a watchdog looks for a request for its ranks' stacks


class Watchdog:
    """``report`` gets every event record as it is logged; ``status`` the live state of the ranks."""

    def __init__(
        self, cfg: RunConfig, report: Callable[[dict[str, Any]], None] = print, status: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.report = report
        self.status = status
        self.beats: dict[int, Beat] = {}  # rank -> last beat of the current attempt
        self.addrs: dict[int, str] = {}
        self.attempt = 0  # groups of ranks this watchdog has seen start (torchrun's restarts on this node)
        self.torchrun_attempt = 0
        self.attempt_pids: set[int] = set()
        self.newest_ckpt: int | None = None
        self.gone: set[int] = set()  # rank pids known dead (killed by us or seen gone)
        self.earlier: set[int] = set()  # rank pids of the attempts before this one (survivors die late)
        self.failures_counted: set[int] = set()  # attempts whose failure the breaker has seen
        self.replays: set[int] = set()  # attempts whose ranks left to replay from a checkpoint (a wrong value): no failure
        self.resumed_logged: set[int] = set()  # attempts whose first training step was logged
        self.closed_attempts: set[int] = set()  # attempts that lost a rank: no hang judging
        self.breaker = CrashLoopBreaker(cfg.crash_loop)
        self.stop_at: float | None = None
        self.stop_sent = False
        self.stop_signals: set[str] = set()  # USR1, TERM: what the stop is for, as far as this process knows
        self.reports = RankReports()
        self.closing: dict[int, Beat] = {}  # ranks of an attempt that lost a rank, until each is gone
        self.local_ranks: dict[int, int] = {}
        self.round = round_end.RoundWatch(cfg.run_dir, cfg.round_id, cfg.node, cfg.suspect_after)
        self.closed_at: float | None = None  # when the current attempt lost a rank
        self.judged: set[int] = set()  # attempts whose failure the health ledger has judged
        self.finished_well = False  # torchrun ended well: `finished` is written after the cleanup
        self.durations = DurationLog()
        self.pool: WarmPool | None = None
        self.world: int | None = None  # the job's world size, as the ranks say
        self.stacks_dir = Path(tempfile.gettempdir())  # where the ranks' handlers dump (set by run)
        self.stacks_seen: str | None = None  # the last stacks request this node answered (its directory)
        self.stacks_polled = 0.0
        self.links: PeerLinks | None = None  # the listener peers' probes and link checks connect to (set by run)
        self.link_check: LinkCheck | None = None
        reader, self.no_gpu = open_reader() if cfg.gpu_monitor else (None, "off (--no-gpu-monitor)")
        self.health_view = RankHealth(cfg.run_dir, cfg.node, cfg.stragglers, reader, os.environ.get("CUDA_VISIBLE_DEVICES"))

    # ------------------------------------------------------------------ events
    def event(self, event: str, **data: Any) -> None:
        """Log ``event`` to the run directory's events (with this node, round and attempt unless given) and pass
        the record to ``report``."""
        data.setdefault("attempt", self.attempt)
        self.report(note(self.cfg.run_dir, event, node=self.cfg.node, round=self.cfg.round_id, **data))

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Run the training under torchrun, supervised until it ends, and return the exit code ``ckpt run`` exits
        with. Whatever happens, torchrun, the ranks and the spares are gone and the timeouts are saved on return."""
        self.cfg.run_dir.mkdir(parents=True, exist_ok=True)
        self.durations = read_timeouts(self.cfg.run_dir) or DurationLog()
        sock_dir = Path(tempfile.mkdtemp(prefix="ckpt-run-"))  # node-local, private (0700)
        sock_path = sock_dir / "supervisor.sock"
        sock = channel.bind(sock_path)
        self.links = PeerLinks()
        self.link_check = LinkCheck(self.cfg.run_dir, self.cfg.node, self.cfg.round_id)
        self.stacks_dir = sock_dir / "stacks"
        self.stacks_seen = str((read_stacks_request(self.cfg.run_dir) or {}).get("dir"))  # not an old request
        env = rank_environment(self.cfg, dict(os.environ), sock_path, sock_dir / "warm")
        if self.cfg.warm:  # spares import torch while torchrun starts up
            self.pool = WarmPool(sock_dir / "warm", self.cfg.nproc_per_node, env, self.cfg.warm_imports, self.cfg.run_dir / "warm.log")
            self.pool.fill()
        argv = torchrun_argv(self.cfg)
        previous = {s: signal.signal(s, self._on_stop_signal) for s in (signal.SIGUSR1, signal.SIGTERM)}
        launched = round(started_at(), 3)  # ckpt run's own start: the account's wall time counts from it
        self.event("start", argv=argv, timeouts=self.timeouts(), gpu_monitor=self.no_gpu or "NVML", launched=launched)
        write_command(self.cfg.run_dir, list(self.cfg.command), os.getcwd(), self.cfg.nproc_per_node)  # for ckpt replay
        # SLURM delivers USR1/TERM to every process of the step, torchrun included, and USR1's
        # default action kills it: torchrun and the ranks ignore USR1 (the ranks get the request
        # on the channel); a rank under `ckpt run` turns TERM into the same request.
        proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=ignore_job_signals)
        code = ExitCode.FAILED
        try:
            code = self._supervise(proc, sock)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if proc.poll() is None:
                end_launcher(proc.pid, self.cfg.grace_s)
            kill_tree([b.pid for b in self.beats.values()], 0.5)  # no orphans, whatever happened
            if self.pool is not None:
                self.pool.close()
            self.health_view.close()
            self.links.close()
            sock.close()
            shutil.rmtree(sock_dir, ignore_errors=True)
            write_timeouts(self.cfg.run_dir, self.durations, self.timeouts())
        if code == ExitCode.OK and self.finished_well:
            self.event("finished", exit_code=0)  # after the cleanup: the account of the run's time ends here
        return code

    def _supervise(self, proc: subprocess.Popen, sock: Any) -> int:
        while True:
            select.select([sock], [], [], self.cfg.poll_s)
            now = time.monotonic()
            for message in channel.receive_all(sock):
                self._handle(message, now)
            if self.stop_at is not None and not self.stop_sent:
                self._send_stop(sock)
            if self.reports.fatal is not None:
                self.event("fatal", **self.reports.fatal, note="a restart cannot fix this: not restarted")
                end_launcher(proc.pid, self.cfg.grace_s)
                return int(self.reports.fatal["exit_code"])
            rc = proc.poll()
            if rc is not None:
                return self._finished(rc)
            if self.attempt_pids and not any(map(alive, self.attempt_pids)) and self._stopped_for_good():
                # Every rank committed the stop checkpoint and is gone: torchrun's exit adds 1 s for
                # nothing, or 300 s (its exit barrier waits for agents other watchdogs killed).
                proc.kill()  # only torchrun: its launchers are gone with the ranks
                return self._finished(proc.wait())
            self._check_deaths()
            self._keep_spares()
            if self.closed_at is not None and self.attempt not in self.judged and now - self.closed_at > JUDGE_AFTER_S:
                self._judge_nodes(self.attempt)
            self._found(self.health_view.poll(now, {b.rank: self.local_ranks.get(b.pid, b.rank) for b in self.beats.values()}))
            if self.link_check is not None:
                training = bool(self.beats) and all(b.phase == "step" for b in self.beats.values()) and self.stop_at is None
                self._found(self.link_check.poll(now, training))
            self._round_end(self.round.poll(now))
            ending = self._ending(now)
            if ending is not None:
                self.event(ending[1], **ending[2])
                end_launcher(proc.pid, self.cfg.grace_s)
                return ending[0]
            hangs = find_hangs(self.beats.values(), self.timeouts(), now) if self.stop_at is None else []
            if hangs:
                self._kill_hung(hangs)
            elif now - self.stacks_polled > STACKS_POLL_S:
                self.stacks_polled = now
                self._answer_stacks_request(now)
            if self.status is not None:
                self.status(
                    {
                        "attempt": self.attempt,
                        "ckpt": self.newest_ckpt,
                        "ranks": {r: (b.step, b.phase, now - b.time) for r, b in sorted(self.beats.items())},
                        "stragglers": [s for s in self.health_view.scores() if s.straggler],
                    }
                )

    def _ending(self, now: float) -> tuple[int, str, dict[str, Any]] | None:
        """(exit code, event, its data) when the round must end now, with its ranks killed."""
        if self.round.over is not None and not self.round.after_stop:
            why = "a node keeps failing: the batch script leaves it behind"
            return ExitCode.NODE_FAULT, "round_ended", {"suspects": self.round.over, "note": why}
        if self.breaker.stalled >= self.breaker.limit:
            return ExitCode.CRASH_LOOP, "crash_loop", {"message": self.breaker.message(newest_step(self.cfg.ckpt_dir))}
        if self.stop_at is not None and now - self.stop_at > self.cfg.stop_deadline_s:
            code = ExitCode.NODE_FAULT if self.round.after_stop else ExitCode.REQUEUE
            why = "no checkpoint committed in time; the previous one is intact"
            return code, "stop_deadline", {"seconds": self.cfg.stop_deadline_s, "note": why}
        return None

    def _stopped_for_good(self) -> bool:
        """The ranks stopped after a checkpoint asked by this node or by another node's round end
        (marker read now if unread); not a teardown TERM's stop (torchrun restarts the group)."""
        if self.reports.stopped_step is not None:
            return True
        if self.reports.stopped_unasked is None:
            return False
        self._round_end(self.round.marker(), ranks_gone=True)
        return self.round.after_stop

    def _finished(self, rc: int) -> int:
        stopped = self.reports.stopped_step
        if stopped is None and self._stopped_for_good():  # for another node's round end
            stopped = self.reports.stopped_unasked
        if stopped is not None and self.round.after_stop:
            self.event("round_ended", suspects=self.round.over, step=stopped, note="checkpoint committed; leaving the node behind")
            return ExitCode.NODE_FAULT
        if stopped is not None:  # torchrun may exit non-zero when it got TERM too
            purpose = stop_purpose(self.stop_signals)[0]
            self.event(
                "stopped_for_requeue", step=stopped, exit_code=ExitCode.REQUEUE, torchrun_exit_code=rc, purpose=purpose,
                signals=sorted(self.stop_signals), note=stopped_note(purpose),
            )  # fmt: skip
            return ExitCode.REQUEUE
        if rc == 0:
            self.finished_well = True  # said once the node is cleaned up (run's end)
            return ExitCode.OK
        self.event("failed", torchrun_exit_code=rc, note=f"torchrun gave up (--max-restarts {self.cfg.max_restarts})")
        return ExitCode.FAILED

    # ------------------------------------------------------------------ beats and failures
    def _handle(self, m: dict[str, Any], now: float) -> None:
        if not isinstance(m.get("rank"), int) or not isinstance(m.get("pid"), int):
            return
        if m.get("event") in LOGGED:
            self.event(str(m["event"]), **{k: v for k, v in m.items() if k not in ("event", "pid", "time", "node", "round")})
            return
        if m.get("event") == "replaying":
            self.replays.add(self.attempt)
        if self.reports.take(m, stop_asked=self.stop_at is not None):
            return
        beat = beat_of(m, now, self.attempt)
        torchrun_attempt = m.get("attempt", 0)
        if beat is None or not isinstance(torchrun_attempt, int) or beat.pid in self.gone or beat.pid in self.earlier:
            return  # not a beat, or from a rank of an attempt already over (a survivor still dying)
        # A new group of ranks on this node: new pids after the attempt lost a rank, or a higher
        # torchrun restart count. (That count is per node: an agent restarting its ranks because
        # another node failed does not raise it, so it cannot number attempts across nodes.)
        new_group = beat.pid not in self.attempt_pids and (self.attempt in self.closed_attempts or torchrun_attempt > self.torchrun_attempt)
        if not new_group and self.attempt in self.closed_attempts:
            return  # a survivor of the attempt being torn down
        if new_group:
            self._next_attempt(torchrun_attempt)
            beat = replace(beat, attempt=self.attempt)
        if not self.attempt_pids:  # the first beat of this attempt's ranks on this node
            self.event("ranks_started", rank=beat.rank, phase=beat.phase, warm=bool(m.get("warm")))
        if beat.pid not in self.attempt_pids:
            self.attempt_pids.add(beat.pid)
            ranks = {**{b.rank: b.pid for b in self.beats.values()}, beat.rank: beat.pid}
            write_ranks(
                self.cfg.run_dir,
                self.cfg.node,
                self.attempt,
                ranks,
                self.cfg.round_id,
                self.links.address if self.links else "",
            )
        if beat.ckpt is not None and (self.newest_ckpt is None or beat.ckpt > self.newest_ckpt):
            self.newest_ckpt = beat.ckpt
        # a (re)start that loaded a checkpoint (not a fresh start that has since saved one)
        if beat.resumed_from is not None and beat.phase == "step" and beat.attempt not in self.resumed_logged:
            self.resumed_logged.add(beat.attempt)
            self.event("resumed", rank=beat.rank, step=beat.step, checkpoint=beat.resumed_from)
        previous = self.beats.get(beat.rank)
        if previous is not None and (previous.phase != beat.phase or previous.step != beat.step):
            self.durations.add(previous.phase, now - previous.time)
        self.beats[beat.rank] = beat
        self._found(self.health_view.on_timing(beat.rank, m.get("timing")))
        self.addrs[beat.rank] = str(m.get("addr", ""))
        if isinstance(m.get("world"), int):
            self.world = m["world"]
        if isinstance(m.get("local_rank"), int):
            self.local_ranks[beat.pid] = m["local_rank"]

    def _next_attempt(self, torchrun_attempt: int) -> None:
        if self.attempt not in self.failures_counted and self.attempt not in self.replays:
            self._failure()  # torchrun restarted the group after a failure it saw
        self._log_deaths(self.closing)
        self.attempt, self.torchrun_attempt = self.attempt + 1, torchrun_attempt
        self.earlier |= self.attempt_pids
        self.beats, self.closing, self.attempt_pids, self.closed_at = {}, {}, set(), None
        self.health_view.new_attempt(self.attempt)
        self.event("restarted", torchrun_restart_count=torchrun_attempt)
        if self.attempt - 1 not in self.judged:
            self._judge_nodes(self.attempt - 1)

    def _check_deaths(self) -> None:
        """A rank process that vanished without saying goodbye: logged within one poll, with its
        node and cause (see ``core.node_ledger``); torchrun sees it too and restarts the group, which
        counts as the failure (see ``_handle``). The attempt is then over: its survivors are
        being torn down by torchrun, and judging their silence would report hangs that are not;
        their exits are still logged (victims or further culprits) until the next attempt."""
        watched = dict(self.beats)
        if self._log_deaths(self.beats):
            self.closed_attempts.add(self.attempt)
            self.closed_at = time.monotonic()
            survivors = {b.pid: b for b in watched.values() if b.pid not in self.gone}
            self.closing.update(survivors)
            self.beats = {}
            for pid in survivors:
                self.reports.said.setdefault(pid, ("terminated", "torn down by ckpt run: a rank of its attempt failed"))
            kill_tree(list(survivors), TEARDOWN_GRACE_S)
        self._log_deaths(self.closing)

    def _log_deaths(self, watched: dict[int, Beat]) -> bool:
        """Log the ranks of ``watched`` that are gone (and forget them); True when one failed."""
        failed = False
        for key, beat in list(watched.items()):
            if beat.pid in self.gone or alive(beat.pid):
                continue
            self.gone.add(beat.pid)
            watched.pop(key, None)
            if self.reports.ended_well(beat.pid):
                continue
            cause, reason = self.reports.said.get(beat.pid) or ("killed", "vanished without a word (SIGKILL, a signal, the OOM killer?)")
            failed = True
            self.event("rank_exited", **self._where(beat), cause=cause, reason=reason, note="torchrun restarts the group")
        return failed

    def _where(self, r: Beat | Any) -> dict[str, Any]:
        """Which rank, where and when in the training (of a ``Beat`` or a ``Hang``): the ledger's facts."""
        return {"rank": r.rank, "local_rank": self.local_ranks.get(r.pid), "pid": r.pid, "step": r.step, "phase": r.phase}

    def _kill_hung(self, hangs: list) -> None:
        """Explain the hang (every rank's stacks, the culprit), then kill this node's ranks:
        the culprit at once (it cannot act on SIGTERM), the others after a short grace."""
        t0 = time.monotonic()
        try:
            hang_dir, _ = open_hang_dir(self.cfg.run_dir, self.cfg.round_id, self.cfg.node, JOIN_HANG_WITHIN_S)
            self.stacks_seen = hang_dir.name
            targets = [stacks.Target(h.rank, h.pid, h.step, h.phase, h.silent_s) for h in hangs]
            stacks.collect(targets, self.stacks_dir, hang_dir, self.cfg.node)
            self._write_reach(hang_dir)
            report: HangReport | None = self._hang_report(hang_dir, t0)
        except (OSError, TimeoutError) as exc:  # a full or read-only run directory: kill the hang all the same
            report, why = None, f"stacks not written: {exc}"
        stacks_s = round(time.monotonic() - t0, 2)
        verdicts = {v.rank: v for v in report.verdicts} if report else {}
        for i, h in enumerate(hangs):
            v = verdicts.get(h.rank)
            self.event(
                "hang",
                **self._where(h),
                silent_s=round(h.silent_s, 2),
                timeout_s=round(h.timeout_s, 2),
                culprit=h.rank in report.culprits if report else i == 0,  # without stacks: the rank behind
                where=v.where if v else "-",
                waiting_in=v.waiting_in if v else None,
            )
        if report is not None:
            summary = report.summary(max(h.silent_s for h in hangs))
            try:
                write_hang_report(hang_dir, {**report.to_json(), "summary": summary, "node": self.cfg.node, "round": self.cfg.round_id})
            except OSError:
                pass  # the event below says it all
            self.event(
                "hang_report", summary=summary, culprits=list(report.culprits), culprit_nodes=list(report.culprit_nodes()),
                victims=list(report.victims), attributed=report.attributed, reason=report.reason, stacks=str(hang_dir), stacks_s=stacks_s,
            )  # fmt: skip
        else:
            self.event("hang_report", summary=hangs[0].reason(), culprits=[hangs[0].rank], culprit_nodes=[self.cfg.node], victims=[],
                       attributed=False, reason=why, stacks=None, stacks_s=stacks_s)  # fmt: skip
        pids = [b.pid for b in self.beats.values()]
        self.gone.update(pids)
        t1 = time.monotonic()
        first = [h.pid for h in hangs if report and h.rank in report.culprits] or [hangs[0].pid]
        # The culprit cannot act on SIGTERM: it is stuck. SIGKILL it at once; its peers, blocked
        # in a collective with it, then fail fast and can end within the grace.
        kill_tree(first, 0.0)
        kill_tree([pid for pid in pids if pid not in first], TEARDOWN_GRACE_S)
        self.event("killed_ranks", pids=pids, teardown_s=round(time.monotonic() - t1, 2))
        self._failure()
        self.closed_attempts.add(self.attempt)
        self.closed_at = time.monotonic()
        self.beats = {}

    def _hang_report(self, hang_dir: Path, t0: float) -> HangReport:
        """The report from every rank's file in ``hang_dir``: this node's, and the other nodes'
        when the job spans several (waited for until ``JOIN_WAIT_S``, then judged without them)."""
        local = len(self.beats)
        nodes = len(read_probes(self.cfg.run_dir, self.cfg.round_id))
        while self.world and self.world > local and time.monotonic() - t0 < JOIN_WAIT_S:
            if len(read_rank_stacks(hang_dir)) >= self.world and len(read_reach(hang_dir)) >= nodes:
                break
            time.sleep(0.1)
        ranks = [r for r in map(parse_rank_file, read_rank_stacks(hang_dir)) if r is not None]
        return analyse(ranks, self.world, read_reach(hang_dir))

    def _write_reach(self, hang_dir: Path) -> None:
        """Which other nodes of this round this node's watchdog reaches now (a TCP connect each,
        ``peer_links.PROBE_TIMEOUT_S`` at most): the network's evidence for the report."""
        peers = {n: a for n, a in read_probes(self.cfg.run_dir, self.cfg.round_id).items() if n != self.cfg.node}
        if peers:
            write_reach(hang_dir, self.cfg.node, peer_links.reach(peers))

    def _answer_stacks_request(self, now: float) -> None:
        """Another node found a hang (or a user ran ``ckpt stacks``): write this node's ranks'
        stacks into the directory the request names; the training goes on."""
        request = read_stacks_request(self.cfg.run_dir)
        if request is None or str(request.get("dir")) == self.stacks_seen or not self.beats:
            return
        if request.get("round") not in ("*", self.cfg.round_id):
            return
        self.stacks_seen = str(request.get("dir"))
        hang_dir = self.cfg.run_dir / HANGS_DIR / self.stacks_seen
        if not hang_dir.is_dir():
            return
        t0 = time.monotonic()
        targets = [stacks.Target(b.rank, b.pid, b.step, b.phase, now - b.time) for b in self.beats.values()]
        try:
            stacks.collect(targets, self.stacks_dir, hang_dir, self.cfg.node)
            self._write_reach(hang_dir)
        except OSError:
            return  # a full or read-only run directory: the training goes on, unexplained
        self.event(
            "stacks_written", ranks=sorted(self.beats), stacks=str(hang_dir), stacks_s=round(time.monotonic() - t0, 2),
            requested_by=request.get("by"),
        )  # fmt: skip

    def _failure(self) -> None:
        self.failures_counted.add(self.attempt)
        if self.breaker.on_failure(self.newest_ckpt):
            return  # the loop stops at its next turn
        self.event(
            "failure_counted", in_a_row_without_progress=self.breaker.stalled, limit=self.breaker.limit, newest_checkpoint=self.newest_ckpt
        )

    def _judge_nodes(self, attempt: int) -> None:
        """After a failure (every node has logged its exits: ``JUDGE_AFTER_S`` later, or the next
        attempt has begun): fold the health ledger; when a node of this round is suspect, end the
        round on every node."""
        self.judged.add(attempt)
        self._judge(checkpoint_first=False)

    def _judge(self, checkpoint_first: bool) -> None:
        self._round_end(self.round.judge(checkpoint_first))

    def _found(self, found: list[tuple[str, dict[str, Any]]]) -> None:
        """Log what the rank health view found; a node that turns suspect ends the round after a checkpoint."""
        for name, data in found:
            suspect = name == "gpu_error" or (name in ("straggler", "slow_link") and self.cfg.straggler_suspect)
            self.event(name, **data, **({"suspect": True} if suspect else {}))
            if suspect and self.round.over is None:
                self._judge(checkpoint_first=True)

    def _round_end(self, ended: round_end.RoundEnd | None, ranks_gone: bool = False) -> None:
        """This round ends (a node's watchdog wrote the marker): at once, or after a checkpoint
        when the ranks still train (the stop request goes to every rank of the job)."""
        stopped = ranks_gone or self.reports.stopped_unasked is not None  # after the checkpoint: end as they exit
        if ended is not None and self.round.take(ended, stopped, can_ask=bool(self.beats) and self.stop_at is None):
            self.stop_at = time.monotonic()
            self.event("round_ending", suspects=ended.suspects, note="a node is suspect: checkpoint at the next step, then leave it behind")

    def _keep_spares(self) -> None:
        """Once every local rank of the attempt trains, replace the spares a restart took (a
        fork of the spare maker: milliseconds, no CPU taken from the training)."""
        if self.pool is not None:
            training = len(self.beats) == self.cfg.nproc_per_node and all(b.phase == "step" for b in self.beats.values())
            for name, data in self.pool.keep(training and self.stop_at is None):
                self.event(name, **data)

    # ------------------------------------------------------------------ preemption
    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        self.stop_signals.add(signal.Signals(signum).name.removeprefix("SIG"))
        if self.stop_at is None:
            self.stop_at = time.monotonic()

    def _send_stop(self, sock: Any) -> None:
        for rank, addr in sorted(self.addrs.items()):
            if rank in self.beats and addr:
                channel.send(sock, addr, {"cmd": "save_and_stop"})
        if self.beats:
            self.stop_sent = True
            purpose, why = stop_purpose(self.stop_signals, self.round.after_stop)
            self.event("stop_requested", ranks=sorted(self.beats), purpose=purpose, signals=sorted(self.stop_signals), note=why)

    def timeouts(self) -> dict[str, float]:
        """The hang timeouts in force now, seconds per phase, calibrated from the durations observed so far."""
        return calibrate(self.durations.durations, self.cfg.timeouts)
