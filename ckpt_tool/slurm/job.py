"""The job chain's driver: the process SLURM signals, carrying out what ``slurm.chain`` decides.

The batch script ``exec``s ``ckpt job``, so USR1 (``--signal=B:USR1@T``) and TERM (scancel, the
time limit, a preemption, our own requeue) reach this process. The handlers only record the
signal (a ``SimpleQueue.put``, safe in a handler); the main thread is always waiting on that
queue, never on a child, so a signal is decided within milliseconds whatever runs: ``ckpt
recover`` in a thread, srun as a child watched by a thread, the background ExcNodeList retries
in a thread whose children never see TERM (it is blocked there, and a blocked mask is inherited).

Every action is one call: the event log (``supervise.run_dir.note``), a log line
``[ckpt job=ID restart=N HH:MM:SS] ...`` on stdout (the job's output; tests and users grep
these words), scontrol through ``slurm.commands``, the two steps the CLI hands in as
``JobSteps`` (``ckpt recover`` and ``ckpt nodes``, called in this process), the pre-flight
check of a node (``--node-check``: ``srun -w NODE bash -c CMD`` under a timeout, one thread a node),
and the user's ``--notify`` command (``slurm.notify``: a thread of its own, waited for at the exit).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ckpt_tool.core.node_ledger import CHECK_EVENT
from ckpt_tool.core.notify import ENV_NAMES, JobContext, NotifyConfig
from ckpt_tool.slurm import chain, commands
from ckpt_tool.slurm.chain import ChainConfig, ChainState, RunSpec
from ckpt_tool.slurm.notify import Notifier
from ckpt_tool.supervise.run_dir import events_size, note, read_events_after

SIGNALS = {signal.SIGUSR1: "USR1", signal.SIGTERM: "TERM"}
EXCLUDE_TRIES, EXCLUDE_PAUSE_S = 40, 0.5  # ~20 s of retries, within a requeued job's KillWait at most


@dataclass(frozen=True)
class JobSteps:
    """The chain's two ckpt steps, as the CLI runs them (they print what ``ckpt recover`` and
    ``ckpt nodes`` print). ``recover(world_size, nodes) -> exit code``; ``nodes(current, active,
    checked, after_failure) -> (ACTION, KEEP, DROP, EXCLUDE, ACTIVE, CHECK, REPLACED)``, raising when
    it cannot decide."""

    recover: Callable[[int, int], int]
    nodes: Callable[[list[str], list[str], list[str], bool], tuple[str, str, str, str, str, str, str]]


@dataclass(frozen=True)
class NodeCheck:
    """The pre-flight check of a node (``--node-check``): a shell ``command`` run on the node by
    ``srun -w NODE``, exit 0 = healthy, killed after ``timeout_s``."""

    command: str
    timeout_s: float = 120.0


@dataclass(frozen=True)
class CheckResult:
    """One node's check: ``passed``, its exit status (None: timed out), the output's last line, seconds."""

    node: str
    passed: bool
    exit_code: int | None
    detail: str
    seconds: float


def check_detail(output: str) -> str:
    """What a node check said, for its event: its own last line; srun's own (``srun: ...``, e.g.
    the step's termination it adds after a failing check, or not at all) only when it said nothing."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    own = [line for line in lines if not line.startswith("srun: ")]
    return (own or lines or [""])[-1][:200]


def _names(text: str) -> list[str]:
    return [n for n in text.split(",") if n and n != "-"]


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous runs on the first node: this one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Job:
    """One start of the batch job: ``run()`` returns the batch script's exit code."""

    def __init__(
        self,
        spec: RunSpec,
        steps: JobSteps,
        max_requeues: int,
        env: MutableMapping[str, str] | None = None,
        out: TextIO | None = None,
        node_check: NodeCheck | None = None,
        node_check_at_start: bool = False,
        notify: NotifyConfig | None = None,
    ) -> None:
        self.spec = spec
        self.steps = steps
        self.node_check = node_check
        # the --notify values (the batch script exports them for this process) stay here: not the ranks' business
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in ENV_NAMES}
        self.out = out or sys.stdout
        self.run_dir = Path(spec.run_dir)
        self.job_id = self.env.get("SLURM_JOB_ID", "")
        restart = self.env.get("SLURM_RESTART_COUNT", "0")
        self.config = ChainConfig(
            job_id=self.job_id,
            restart=int(restart) if restart.isdigit() else 0,
            max_requeues=max_requeues,
            min_nodes=spec.min_nodes,
            scontrol=commands.available("scontrol"),
            node_check_at_start=node_check_at_start and node_check is not None,
        )
        self._events: queue.SimpleQueue[chain.Event] = queue.SimpleQueue()
        self._payload: subprocess.Popen[bytes] | None = None
        self._round: tuple[str, int, int] = ("", 0, 0)  # the payload's round: id, nodes, events.jsonl's size at its start
        self.notifier = Notifier(notify, self.run_dir, self._context, self.log, self.env) if notify is not None else None

    def run(self) -> int:
        """Install the handlers, then decide and act until the chain says exit."""
        for signum in SIGNALS:
            signal.signal(signum, self._on_signal)
        state = ChainState()
        pending: deque[chain.Event] = deque([chain.Started(self.env.get("SLURM_JOB_NODELIST", ""))])
        while True:
            event = pending.popleft() if pending else self._next_event()
            state, actions = chain.step(self.config, state, event)
            for action in actions:
                if isinstance(action, chain.Exit):
                    if self.notifier is not None:  # the job's last events are told before it ends
                        self.notifier.close()
                    return action.code
                answer = self._do(action)
                if answer is not None:
                    pending.append(answer)

    # ------------------------------------------------------------------ signals and waiting
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._events.put(chain.SignalArrived(SIGNALS[signal.Signals(signum)]))

    def _next_event(self) -> chain.Event:
        while True:
            try:
                return self._events.get(timeout=0.5)
            except queue.Empty:
                continue

    def _in_thread(self, work: Callable[[], chain.Event], crashed: chain.Event, block_term: bool = False) -> None:
        """Run ``work`` in a thread; its answer (``crashed`` if it raised) goes on the queue."""

        def body() -> None:
            if block_term:  # inherited by the scontrol it starts: the requeue's TERM kills none of them
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                event = work()
            except Exception:  # noqa: BLE001 - a step that crashed answers as failed
                traceback.print_exc()
                event = crashed
            self._events.put(event)

        threading.Thread(target=body, daemon=True).start()

    # ------------------------------------------------------------------ actions
    def log(self, text: str) -> None:
        """One line of the job's output, as the batch script wrote it."""
        print(f"[ckpt job={self.job_id} restart={self.config.restart} {time.strftime('%H:%M:%S')}] {text}", file=self.out, flush=True)

    def _do(self, action: chain.Action) -> chain.Event | None:
        if isinstance(action, chain.Log):
            self.log(action.text)
        elif isinstance(action, chain.Note):
            try:
                note(self.run_dir, action.event, **dict(action.fields))
            except OSError as exc:
                self.log(f"cannot write the event {action.event} to {self.run_dir}: {exc.strerror or exc}")
        elif isinstance(action, chain.Notify):
            if self.notifier is not None:
                self.notifier.send(action.event, dict(action.fields))
        elif isinstance(action, chain.ForwardStop):
            self._forward_stop()
        elif isinstance(action, chain.AskSlurm):
            return chain.SlurmSaid(*commands.job_state_reason(self.job_id))
        elif isinstance(action, chain.AskNodes):
            return self._ask_nodes(action.after_failure, _names(action.active), _names(action.checked))
        elif isinstance(action, chain.CheckNodes):
            nodes = _names(action.nodes) or self._nodes_now()
            self._in_thread(lambda: self._check_nodes(nodes), chain.NodesChecked("-", ",".join(nodes)))
        elif isinstance(action, chain.StartRecover):
            n = len(_names(action.nodes)) or self._num_nodes()
            self._in_thread(lambda: chain.RecoverExited(self.steps.recover(n * self.spec.nproc_per_node, n)), chain.RecoverExited(1))
        elif isinstance(action, chain.StartRun):
            self._start_run(action.round, _names(action.nodes))
        elif isinstance(action, chain.Shrink):
            return self._shrink(action.keep)
        elif isinstance(action, chain.Requeue):
            return chain.RequeueDone(commands.requeue(self.job_id))
        elif isinstance(action, chain.Exclude):
            self._in_thread(lambda: self._exclude(action.nodes), chain.ExcludeDone(False), block_term=True)
        return None

    def _context(self) -> JobContext:
        """Where the job is now, for a notification."""
        return JobContext(
            self.job_id, self.config.restart, self.spec.ckpt_dir, self.spec.run_dir, tuple(self._nodes_now()), socket.gethostname()
        )

    def _num_nodes(self) -> int:
        value = self.env.get("SLURM_JOB_NUM_NODES", "1")
        return int(value) if value.isdigit() else 1

    def _nodes_now(self) -> list[str]:
        nodelist = self.env.get("SLURM_JOB_NODELIST", "")
        return commands.hostnames(nodelist) or [n for n in nodelist.split(",") if n]

    def _ask_nodes(self, after_failure: bool, active: list[str], checked: list[str]) -> chain.Event:
        try:
            return chain.NodesSaid(*self.steps.nodes(self._nodes_now(), active, checked, after_failure))
        except Exception as exc:  # noqa: BLE001 - ckpt nodes failing has its fallback in the chain
            print(f"error: ckpt nodes: {getattr(exc, 'message', exc)}", file=sys.stderr, flush=True)
            return chain.NodesSaid(None)

    def _start_run(self, round_: int, active: list[str]) -> None:
        nodes = active or self._nodes_now()
        head = nodes[0] if nodes else socket.gethostname()
        endpoint = f"{commands.node_addr(head) or head}:{free_port()}"
        n, nodelist = (len(active), ",".join(active)) if active else (self._num_nodes(), self.env.get("SLURM_JOB_NODELIST", ""))
        standby = [x for x in self._nodes_now() if x not in active] if active else []
        spares = f"; standing by: {','.join(standby)}" if standby else ""
        self.log(f"round {round_}: starting ckpt run on {n} node(s) ({nodelist}){spares}, rendezvous {endpoint}")
        argv = chain.srun_argv(self.spec, self.job_id, self.config.restart, round_, n, endpoint, active)
        self._round = (chain.round_id(self.job_id, self.config.restart, round_), n, events_size(self.run_dir))
        try:
            payload = subprocess.Popen(argv, env=self.env)
        except OSError as exc:
            self.log(f"cannot start srun: {exc.strerror or exc}")
            self._events.put(chain.RunExited(127))
            return
        self._payload = payload

        def wait() -> chain.Event:
            return chain.RunExited(chain.exit_status(payload.wait()))

        self._in_thread(wait, chain.RunExited(1))

    def _forward_stop(self) -> None:
        """USR1 to the payload once every node's ``ckpt run`` of its round is ready (see
        ``chain.ForwardStop``), from a thread: the main thread goes on deciding."""
        payload, (round_, n, offset) = self._payload, self._round
        if payload is None or payload.poll() is not None:
            return

        def when_ready() -> None:
            seen: list[dict[str, Any]] = []
            at, deadline = offset, time.monotonic() + chain.STOP_HOLD_S
            while payload.poll() is None:
                new, at = read_events_after(self.run_dir, at)
                seen += new
                if chain.round_ready(seen, round_, n):
                    break
                if time.monotonic() > deadline:
                    self.log(f"not every node's ckpt run started within {chain.STOP_HOLD_S:.0f} s: asking them to stop all the same")
                    break
                time.sleep(0.2)
            if payload.poll() is None:  # else it ended first: the chain hears its exit
                try:
                    payload.send_signal(signal.SIGUSR1)
                except ProcessLookupError:
                    pass

        threading.Thread(target=when_ready, daemon=True).start()

    def _check_nodes(self, nodes: list[str]) -> chain.Event:
        """The pre-flight check on every node at once; each result is logged and recorded."""
        results: list[CheckResult] = []
        threads = [threading.Thread(target=lambda n=n: results.append(self._check_node(n)), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in sorted(results, key=lambda r: nodes.index(r.node)):
            verdict = "passed" if r.passed else "failed"
            self.log(
                f"node check on {r.node}: {verdict} ({'exit ' + str(r.exit_code) if r.exit_code is not None else 'timed out'}, {r.seconds:.1f} s){': ' + r.detail if r.detail else ''}"
            )
            try:
                note(
                    self.run_dir,
                    CHECK_EVENT,
                    node=r.node,
                    result=verdict,
                    exit_code=r.exit_code,
                    detail=r.detail,
                    seconds=round(r.seconds, 3),
                )
            except OSError as exc:
                self.log(f"cannot write the event {CHECK_EVENT} to {self.run_dir}: {exc.strerror or exc}")
        passed = ",".join(r.node for r in results if r.passed) or "-"
        failed = ",".join(r.node for r in results if not r.passed) or "-"
        return chain.NodesChecked(passed, failed)

    def _check_node(self, node: str) -> CheckResult:
        """``--node-check`` on ``node`` (srun -w NODE), killed after its timeout: exit 0 passes."""
        assert self.node_check is not None
        argv = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--kill-on-bad-exit=1", "bash", "-c", self.node_check.command]
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, env={**self.env, "CKPT_CHECK_NODE": node}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            return CheckResult(node, False, 127, f"cannot start srun: {exc.strerror or exc}", 0.0)
        try:
            output, _ = proc.communicate(timeout=self.node_check.timeout_s)
            code: int | None = chain.exit_status(proc.returncode)
        except subprocess.TimeoutExpired:
            proc.terminate()  # srun cancels the step on TERM
            try:
                output, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
            code = None
        detail = check_detail(output.decode(errors="replace"))
        if code is None:
            detail = f"timed out after {self.node_check.timeout_s:g} s" + (f"; last output: {detail}" if detail else "")
        return CheckResult(node, code == 0, code, detail, time.monotonic() - started)

    def _shrink(self, keep: str) -> chain.Event:
        resized = commands.shrink(self.job_id, keep)
        if resized is None:
            return chain.ShrinkDone(None)
        self.env.update(resized)  # SLURM_JOB_NODELIST, SLURM_JOB_NUM_NODES... of the smaller job
        return chain.ShrinkDone(self.env.get("SLURM_JOB_NODELIST", keep), self.env.get("SLURM_JOB_NUM_NODES", str(len(keep.split(",")))))

    def _exclude(self, nodes: str) -> chain.Event:
        # Only a pending job takes ExcNodeList. Requeued at its start the job is pending at once;
        # after steps it stays completing while this process lives and the update may not take.
        # Then the next start gives the node back before training (ckpt nodes at every start).
        for _ in range(EXCLUDE_TRIES):
            if commands.exclude_nodes(self.job_id, nodes):
                return chain.ExcludeDone(True)
            time.sleep(EXCLUDE_PAUSE_S)
        return chain.ExcludeDone(False)
