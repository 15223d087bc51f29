"""Figure 9: the SLURM requeue chain: USR1 -> checkpoint -> requeue -> restart -> first resumed step (seconds).

How: the one-machine SLURM cluster of the tests (``.ci/slurm-up``: slurmctld + two fake nodes on
loopback, ``AuthInfo=cred_expire=10``) is started when it does not answer, and stopped at the end
only if this script started it and no other job is queued. Each trial is one real job of the
reference recipe submitted as a user does, and driven as tests/slurm/test_submit_chain.py does::

    python -m ckpt_tool.cli.main submit --ckpt-dir D --nproc-per-node 2 --time 20:00 -- \\
        -m ckpt_tool.recipes.tiny_gpt --ckpt-dir D --metrics M --steps 60 --save-every 5 \\
        --d-model 64 --n-layer 2 --corpus-tokens 60000

Once the script says "ready: trap installed" and rank 0 has written step >= 15, USR1 goes to the
batch shell (``scancel --signal=USR1 --batch J``; the time is ``time.time()`` just before). The
script's trap forwards it to ``ckpt run``, which asks the ranks to checkpoint at the next step and
stop; the script then requeues the job (``scontrol requeue``). Trial 1 lets SLURM start the
requeued job by itself (eligible after cred_expire); the others release it as the test harness
does (``scontrol update JobId=J StartTime=now+1`` as soon as squeue says PENDING). Each job then
resumes and runs to step 60; it must end with "training finished", and its first new step must be
the stop step + 1.

Times: the wall-clock ``time`` of the events in ``D/run/events.jsonl`` (stop_requested,
stopped_for_requeue, requeue, job_start, recover, start) and of the ``commit`` of the stop step in
``D/index.jsonl`` (the manifest's ``created_at`` is taken just before the DCP write begins); job
states from ``squeue`` polled every 0.1 s; the metrics file tailed every 10 ms (one line per step,
stamped when seen). Processes of the job (found by their command line naming D, psutil) are
polled every 20 ms for their exit (gone or zombie). After a requeue ``ckpt run`` starts at
attempt 0, and the watchdog logs "restarted"/"resumed" only for attempts > 0: there is no event
for the ranks' first beat or for the resumed step. The first beat is therefore the mtime of the
rank's heartbeat socket (``rankR-PID.sock`` next to ``$CKPT_HEARTBEAT_SOCKET``, bound by the first
``heartbeat()`` call, in ``CheckpointManager.__init__``, just before its first beat), the later of
the two ranks; the resumed step is the first new metrics line (resume() and one training step).
Rank start = process start time (/proc starttime, converted with /proc/uptime).

Segments (medians over trials, min-max): (a) USR1 -> PENDING: -> stop_requested -> commit of the
stop step ("checkpoint": the ranks reach the step boundary, probe, DCP write, hashes, commit) ->
stopped_for_requeue (ranks close and exit, torchrun exits, ckpt run notices) -> requeue event
(ckpt run exits, srun returns, ``ckpt note``) -> PENDING in squeue. (b) requeue event -> RUNNING
in squeue, by SLURM itself (1 trial) and with ``StartTime=now+1`` (the others). (c) job_start ->
recover event (its own ``seconds`` = the validation) -> ckpt run start -> first beat of the ranks
-> first new metrics line. No target: the ratio column is each segment's share of its chain
(value / the chain's total in the reference column); a plain save of this 2 MB state is small,
so the "checkpoint" segment is the absolute reference for the rest.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from common import Result, Row, Stats

from ckpt_tool.recipes.launch import RECIPE, ckpt_submit_command

REPO = Path(__file__).resolve().parent.parent
RECIPE_ARGS = ("--steps", "60", "--save-every", "5", "--d-model", "64", "--n-layer", "2", "--corpus-tokens", "60000")
STEPS = 60
USR1_AT_STEP = 15
CRED_EXPIRE_S = 10  # AuthInfo=cred_expire=10 in .ci/slurm-up
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- cluster
def sh(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def cluster_up() -> bool:
    """Start the test cluster unless it answers; returns whether it was already running."""
    if common.cluster_answers():
        return True
    common.log("SLURM does not answer: starting it with .ci/slurm-up")
    proc = subprocess.run(["bash", str(REPO / ".ci" / "slurm-up")], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not common.cluster_answers():
        raise RuntimeError(f".ci/slurm-up failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    return False


def cluster_down_if_idle(was_running: bool = False) -> str:
    """Stop the test cluster if this script started it (``was_running`` False) and no job is
    queued; returns what became of it, for the figure's notes."""
    if was_running:
        return "was already running; left running"
    queued = sh("squeue", "-h", "-o", "%i").stdout.split()
    if queued:
        return f"left running: started by this script, but jobs {', '.join(queued)} are queued"
    proc = sh("bash", str(REPO / ".ci" / "slurm-down"), timeout=120)
    return "stopped (.ci/slurm-down): started by this script" if proc.returncode == 0 else f"slurm-down failed: {proc.stderr[-300:]}"


# ----------------------------------------------------------------------------- watchers
class Poller:
    """A background thread calling ``fn`` every ``interval_s``."""

    def __init__(self, fn: Callable[[], None], interval_s: float, name: str) -> None:
        self.fn, self.interval_s = fn, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.fn()
            self._stop.wait(self.interval_s)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class JobStates:
    """squeue state transitions of one job: [(time, state)], "" once it left the queue."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.transitions: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def poll(self) -> None:
        state = common.squeue_state(self.job_id)
        now = time.time()
        with self._lock:
            if not self.transitions or self.transitions[-1][1] != state:
                self.transitions.append((now, state))

    def current(self) -> str | None:
        with self._lock:
            return self.transitions[-1][1] if self.transitions else None

    def first(self, state: str, after: float) -> float | None:
        with self._lock:
            return next((t for t, s in self.transitions if s == state and t > after), None)


def boot_time() -> float:
    """Wall-clock time of boot, to 10 ms (psutil's boot time is whole seconds)."""
    samples = []
    for _ in range(5):
        with open("/proc/uptime") as f:
            samples.append(time.time() - float(f.read().split()[0]))
    return statistics.median(samples)


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, starttime in clock ticks) of a process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


class JobProcs:
    """The job's processes (command line naming the checkpoint directory): start, exit, and for
    ranks the mtime of their heartbeat socket (= their first beat)."""

    def __init__(self, marker: str) -> None:
        import psutil

        self.psutil = psutil
        self.marker = marker
        self.boot = boot_time()
        self.procs: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def role(cmd: list[str]) -> str | None:
        if not cmd or Path(cmd[0]).name == "srun":
            return None
        if "torch.distributed.run" in cmd:
            return "torchrun"
        if "ckpt_tool.cli.main" in cmd:
            return "ckpt_run" if "run" in cmd else None  # not `ckpt recover` / `ckpt note`
        if "ckpt_tool.supervise.handoff" in cmd:
            return "launcher"  # what torchrun started for a rank; a pre-warmed spare runs the rank
        return "rank" if RECIPE in cmd else None  # a cold rank, or a spare that took a rank over (its title)

    def scan(self) -> None:
        """Find new processes of the job (every 0.2 s: they live for seconds at least)."""
        for p in self.psutil.process_iter(["pid", "cmdline"]):
            pid, cmd = p.info["pid"], p.info["cmdline"] or []
            with self._lock:
                if pid in self.procs:
                    continue
            if not any(self.marker in arg for arg in cmd):
                continue
            role = self.role(cmd)
            stat = proc_stat(pid)
            if role is None or stat is None or stat[0] == "Z":
                continue
            entry: dict[str, Any] = {"role": role, "start": self.boot + stat[1] / CLK_TCK, "gone": None, "sock": None, "sock_mtime": None}
            if role in ("rank", "launcher"):
                try:  # a warm rank's environment is not readable (its title took that memory)
                    env = p.environ()
                    sock = env.get("CKPT_HEARTBEAT_SOCKET")
                    if sock:  # the rank's own socket, named with the pid of the process that runs it
                        entry["sock"] = (str(Path(sock).parent), f"rank{env.get('RANK', '0')}-*.sock")
                    entry["rank"] = int(env.get("RANK", "-1"))
                except (self.psutil.Error, ValueError):
                    pass
            with self._lock:
                self.procs[pid] = entry

    def watch(self) -> None:
        """Exit times and socket mtimes of the known processes (every 20 ms)."""
        now = time.time()
        with self._lock:
            items = [(pid, e) for pid, e in self.procs.items() if e["gone"] is None]
        for pid, entry in items:
            if entry["sock"] and entry["sock_mtime"] is None:
                directory, pattern = entry["sock"]
                mtimes = []
                for path in Path(directory).glob(pattern):
                    try:
                        mtimes.append(path.stat().st_mtime)
                    except OSError:
                        pass
                mtimes = [m for m in mtimes if m >= entry["start"] - 0.01]  # bound by this process, not an earlier one
                if mtimes:
                    entry["sock_mtime"] = min(mtimes)
            stat = proc_stat(pid)
            if stat is None or stat[0] == "Z":
                entry["gone"] = now

    def select(self, role: str, started_after: float, started_before: float = float("inf")) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self.procs.values() if e["role"] == role and started_after <= e["start"] < started_before]


# ----------------------------------------------------------------------------- one trial
def wait_for(predicate: Callable[[], Any], what: str, timeout: float, job: str) -> Any:
    value = common.poll_until(predicate, timeout)
    if not value:
        raise RuntimeError(f"job {job}: {what} did not happen within {timeout:.0f} s (state {common.squeue_state(job)!r})")
    return value


def first_event(events: list[dict[str, Any]], name: str, after: float, **match: Any) -> dict[str, Any]:
    for e in events:
        if e.get("event") == name and e["time"] > after and all(str(e.get(k)) == str(v) for k, v in match.items()):
            return e
    raise RuntimeError(f"no {name!r} event after {after:.3f} {match or ''} in the log")


def submit(root: Path) -> tuple[str, Path, Path]:
    ckpt, metrics = root / "ckpt", root / "metrics.jsonl"
    argv = ckpt_submit_command(
        ckpt, ["--ckpt-dir", str(ckpt), "--metrics", str(metrics), *RECIPE_ARGS], ("--nproc-per-node", "2", "--time", "20:00")
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    job_id = proc.stdout.splitlines()[0].strip() if proc.stdout.strip() else ""
    if proc.returncode != 0 or not job_id.isdigit():
        raise RuntimeError(f"ckpt submit failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    return job_id, ckpt, metrics


def run_trial(root: Path, natural: bool) -> dict[str, Any]:
    job_id, ckpt, metrics = submit(root)
    run_dir = ckpt / "run"
    out_file = run_dir / f"slurm-{job_id}.out"
    tail, states, procs = common.MetricsTail(metrics), JobStates(job_id), JobProcs(str(ckpt))
    pollers = [
        Poller(tail.poll, 0.01, "metrics"),
        Poller(states.poll, 0.1, "squeue"),
        Poller(procs.scan, 0.2, "ps"),
        Poller(procs.watch, 0.02, "exits"),
    ]
    for p in pollers:
        p.start()
    done = False
    try:

        def output() -> str:
            return out_file.read_text(errors="replace") if out_file.exists() else ""

        wait_for(lambda: "restart=0" in output() and "ready: trap installed" in output(), "readiness", 180, job_id)
        wait_for(lambda: any(s >= USR1_AT_STEP for s, _ in tail.snapshot()), f"step {USR1_AT_STEP}", 300, job_id)
        t_usr1 = time.time()
        if sh("scancel", "--signal=USR1", "--batch", job_id).returncode != 0:
            raise RuntimeError(f"scancel --signal=USR1 --batch {job_id} failed")
        t_pending = wait_for(lambda: states.first("PENDING", t_usr1), "requeue (PENDING)", 180, job_id)
        t_update = None
        if not natural:
            t_update = time.time()
            sh("scontrol", "update", f"JobId={job_id}", "StartTime=now+1")
        t_running = wait_for(lambda: states.first("RUNNING", t_pending), "restart (RUNNING)", 180, job_id)
        wait_for(lambda: states.current() == "", "completion", 300, job_id)
        done = True
    finally:
        for p in pollers:
            p.stop()
        if not done:
            sh("scancel", job_id)
    text = output()
    if "restart=1" not in text or "training finished" not in text:
        raise RuntimeError(f"job {job_id} did not resume and finish:\n{text[-2000:]}")
    return analyse(job_id, ckpt, tail.snapshot(), procs, t_usr1, t_pending, t_update, t_running, natural, states.transitions)


def analyse(
    job_id: str,
    ckpt: Path,
    lines: list[tuple[int, float]],
    procs: JobProcs,
    t_usr1: float,
    t_pending: float,
    t_update: float | None,
    t_running: float,
    natural: bool,
    transitions: list[tuple[float, str]],
) -> dict[str, Any]:
    events = common.read_jsonl(ckpt / "run" / "events.jsonl")
    index = common.read_jsonl(ckpt / "index.jsonl")
    stop_req = first_event(events, "stop_requested", t_usr1)
    stopped = first_event(events, "stopped_for_requeue", t_usr1)
    stop_step = int(stopped["step"])
    commit = first_event(index, "commit", t_usr1, step=stop_step)
    requeue = first_event(events, "requeue", t_usr1)
    job_start = first_event(events, "job_start", t_usr1, restarts=1)
    recover = first_event(events, "recover", job_start["time"])
    start = first_event(events, "start", recover["time"])
    resumed = [(s, t) for s, t in lines if t > job_start["time"]]
    if not resumed or resumed[0][0] != stop_step + 1:
        raise RuntimeError(f"job {job_id}: first step after the requeue is {resumed[:1]}, expected {stop_step + 1}")
    first_new = resumed[0][1]
    before = [t for s, t in lines if t < t_usr1]
    step_times = [b - a for a, b in zip(before, before[1:], strict=False)]
    old_ranks = procs.select("rank", 0, t_usr1)
    # the processes torchrun started for the ranks: launchers (ranks run by pre-warmed spares) or cold ranks
    new_ranks = procs.select("launcher", job_start["time"]) or procs.select("rank", job_start["time"])
    old_torchrun = procs.select("torchrun", 0, t_usr1)
    old_ckpt_run = procs.select("ckpt_run", 0, t_usr1)
    new_torchrun = procs.select("torchrun", job_start["time"])

    def latest(entries: list[dict[str, Any]], key: str) -> float | None:
        values = [e[key] for e in entries if e.get(key) is not None]
        return max(values) if values and len(values) == len(entries) else None

    ranks_gone = latest(old_ranks, "gone")
    torchrun_gone = latest(old_torchrun, "gone")
    ckpt_run_gone = latest(old_ckpt_run, "gone")
    ranks_started = latest(new_ranks, "start")
    first_beat = latest(new_ranks, "sock_mtime")
    torchrun_started = latest(new_torchrun, "start")
    t = {
        "usr1": t_usr1,
        "stop_requested": stop_req["time"],
        "save_write_begins": float(commit["created_at"]),
        "commit": commit["time"],
        "ranks_exited": ranks_gone,
        "torchrun_exited": torchrun_gone,
        "stopped_for_requeue": stopped["time"],
        "ckpt_run_exited": ckpt_run_gone,
        "requeue": requeue["time"],
        "pending_seen": t_pending,
        "start_time_update": t_update,
        "running_seen": t_running,
        "job_start": job_start["time"],
        "recover": recover["time"],
        "ckpt_run_start": start["time"],
        "torchrun_started": torchrun_started,
        "ranks_started": ranks_started,
        "first_beat": first_beat,
        "first_new_metrics_line": first_new,
    }
    return {
        "job_id": job_id,
        "natural_requeue_wait": natural,
        "stop_step": stop_step,
        "times": t,
        "recover_validation_s": float(recover.get("seconds") or 0.0),
        "step_s_median": statistics.median(step_times) if step_times else None,
        "ranks_found": {"old": len(old_ranks), "new": len(new_ranks)},
        "squeue": [(round(x - t_usr1, 3), s) for x, s in transitions],
    }


# ----------------------------------------------------------------------------- report
def span(trial: dict[str, Any], a: str, b: str) -> float | None:
    x, y = trial["times"].get(a), trial["times"].get(b)
    return None if x is None or y is None else y - x


OWN_PATH_TARGET_S = 12.0  # issue #16
RANKS_GONE_TARGET_S = 1.0  # issue #16

CHAIN_A = [
    ("(a) USR1 -> stop_requested event (trap, srun forwards USR1, ckpt run's next poll)", "usr1", "stop_requested"),
    ('(a) stop_requested -> checkpoint of the stop step committed ("checkpoint")', "stop_requested", "commit"),
    ("(a) commit -> stopped_for_requeue (ranks exit, torchrun exits, ckpt run notices)", "commit", "stopped_for_requeue"),
    ("(a) stopped_for_requeue -> requeue event (ckpt run exits, srun returns, `ckpt note`)", "stopped_for_requeue", "requeue"),
    ("(a) requeue event -> PENDING in squeue (`scontrol requeue`)", "requeue", "pending_seen"),
]
SPLIT_A = [
    ("stop_requested -> save begins writing (step boundary, probe, state dict)", "stop_requested", "save_write_begins"),
    ("save begins writing -> commit (DCP write, hashes, commit)", "save_write_begins", "commit"),
    ("commit -> last rank process exited", "commit", "ranks_exited"),
    ("last rank exited -> torchrun exited", "ranks_exited", "torchrun_exited"),
    ("torchrun exited -> stopped_for_requeue event", "torchrun_exited", "stopped_for_requeue"),
    ("stopped_for_requeue -> ckpt run process exited", "stopped_for_requeue", "ckpt_run_exited"),
]
CHAIN_C = [
    ("(c) job_start -> recover done (`ckpt recover`: interpreter, imports, validation)", "job_start", "recover"),
    ("(c) recover -> ckpt run start (scontrol, srun, interpreter)", "recover", "ckpt_run_start"),
    ("(c) ckpt run start -> first beat of the ranks (torchrun, rank start, imports, init, model)", "ckpt_run_start", "first_beat"),
    ("(c) first beat -> first new metrics line (resume(): load, checks; + 1 step)", "first_beat", "first_new_metrics_line"),
]
SPLIT_C = [
    ("ckpt run start -> torchrun process started", "ckpt_run_start", "torchrun_started"),
    ("ckpt run start -> rank processes started (the later rank)", "ckpt_run_start", "ranks_started"),
    ("rank processes started -> first beat (imports, init_distributed, corpus, FSDP model, manager)", "ranks_started", "first_beat"),
]


def stats_of(trials: list[dict[str, Any]], a: str, b: str) -> Stats | None:
    values = [v for v in (span(t, a, b) for t in trials) if v is not None]
    return Stats.of(values) if values else None


def chain_rows(trials: list[dict[str, Any]], chain: list[tuple[str, str, str]], total_label: str, start: str, end: str) -> list[Row]:
    total = stats_of(trials, start, end)
    assert total is not None
    reference = f"{total_label} {total.fmt(2, 's')}"
    rows = [Row(f"{total_label} (total)", total.fmt(2, "s"))]
    for label, a, b in chain:
        s = stats_of(trials, a, b)
        if s is not None:
            rows.append(Row(label, s.fmt(2, "s"), reference, round(s.median / total.median, 3)))
    return rows


def split_note(trials: list[dict[str, Any]], title: str, split: list[tuple[str, str, str]]) -> str:
    parts = []
    for label, a, b in split:
        s = stats_of(trials, a, b)
        parts.append(f"{label} {s.fmt(2, 's') if s else 'n/a'}")
    return f"{title}: " + "; ".join(parts)


def report(trials: list[dict[str, Any]], cluster_note: str) -> Result:
    result = Result("9", f"SLURM requeue chain: USR1 -> checkpoint -> requeue -> first resumed step ({len(trials)} jobs, seconds)")
    result.rows += chain_rows(trials, CHAIN_A, "(a) USR1 -> PENDING", "usr1", "pending_seen")
    natural = [t for t in trials if t["natural_requeue_wait"]]
    forced = [t for t in trials if not t["natural_requeue_wait"]]
    nat = stats_of(natural, "requeue", "running_seen")
    frc = stats_of(forced, "requeue", "running_seen")
    if nat is not None:
        ratio = round(nat.median / CRED_EXPIRE_S, 3)
        result.rows.append(Row("(b) requeue event -> RUNNING, SLURM by itself", nat.fmt(2, "s"), f"cred_expire {CRED_EXPIRE_S} s", ratio))
    if frc is not None:
        ref = f"SLURM by itself {nat.fmt(2, 's')}" if nat else "-"
        ratio = round(frc.median / nat.median, 3) if nat else None
        result.rows.append(Row("(b) requeue event -> RUNNING, `scontrol update StartTime=now+1`", frc.fmt(2, "s"), ref, ratio))
    result.rows += chain_rows(trials, CHAIN_C, "(c) job_start -> first new metrics line", "job_start", "first_new_metrics_line")
    whole = stats_of(forced or trials, "usr1", "first_new_metrics_line")
    if whole is not None:
        label = "USR1 -> first resumed step, end to end" + (" (StartTime=now+1 trials)" if forced else "")
        result.rows.append(Row(label, whole.fmt(2, "s")))
    # issue #16's measures: the job's own share of the path (SLURM's PENDING -> RUNNING left out)
    own = [
        a + b
        for a, b in ((span(t, "usr1", "pending_seen"), span(t, "running_seen", "first_new_metrics_line")) for t in trials)
        if a is not None and b is not None
    ]
    if own:
        result.rows.append(
            common.median_at_most(
                "USR1 -> next step trained after the requeue, SLURM's scheduling delay (PENDING -> RUNNING) excluded",
                Stats.of(own),
                OWN_PATH_TARGET_S,
                "(a) USR1 -> PENDING + RUNNING -> first new metrics line",
            )
        )
    gone = stats_of(trials, "commit", "ranks_exited")
    if gone is not None:
        result.rows.append(common.median_at_most("commit of the stop checkpoint -> all ranks gone", gone, RANKS_GONE_TARGET_S))

    result.notes.append(split_note(trials, "(a) split of the checkpoint and stop segments", SPLIT_A))
    if frc is not None:
        split = [
            ("requeue -> PENDING seen", "requeue", "pending_seen"),
            ("PENDING -> scontrol update sent", "pending_seen", "start_time_update"),
            ("update -> RUNNING seen", "start_time_update", "running_seen"),
        ]
        result.notes.append(split_note(forced, "(b) with StartTime=now+1", split))
    started = stats_of(trials, "running_seen", "job_start")
    if started is not None:
        result.notes.append(f"(b)/(c) RUNNING in squeue -> job_start event (batch script start, `ckpt note`): {started.fmt(2, 's')}")
    result.notes.append(split_note(trials, "(c) split of the start of ckpt run", SPLIT_C))
    validation = Stats.of([t["recover_validation_s"] for t in trials])
    step = Stats.of([t["step_s_median"] for t in trials if t["step_s_median"] is not None])
    result.notes.append(
        f'(c) `ckpt recover`\'s own "seconds" (validation of the newest checkpoint, 2 MB) {validation.fmt(3, "s")}; '
        f"median training step before USR1 {step.fmt(3, 's')}: the last segment is resume() + about one step"
    )
    result.notes.append(
        'no "restarted"/"resumed" event after a requeue (ckpt run starts at attempt 0; the watchdog logs them for attempts > 0 only): '
        "first beat = mtime of the rank's heartbeat socket, resumed = first new metrics line (tailed every 10 ms)"
    )
    result.notes.append(
        f"stop steps: {', '.join(str(t['stop_step']) for t in trials)} (USR1 sent once step >= {USR1_AT_STEP} was seen); "
        'every job resumed at the next step and ended with "training finished"'
    )
    result.notes.append(f"SLURM cluster: {cluster_note}")
    result.details = {"trials": trials}
    return result


def main() -> None:
    parser = common.base_parser(__doc__)
    parser.add_argument("--trials", type=int, default=None, help="jobs (default 5; --quick 2); the first waits for SLURM's requeue delay")
    args = parser.parse_args()
    trials_n = args.trials or (2 if args.quick else 5)
    if trials_n < 2:
        parser.error("--trials must be >= 2 (one natural requeue wait, one released with StartTime=now+1)")
    was_running = cluster_up()
    trials: list[dict[str, Any]] = []
    try:
        with common.scratch_dir(args.work_dir, "requeue_chain") as work:
            for i in range(trials_n):
                natural = i == 0
                root = work / f"trial{i}"
                root.mkdir()
                trial = run_trial(root, natural)
                trials.append(trial)
                t = trial["times"]
                common.log(
                    f"trial {i + 1}/{trials_n} (job {trial['job_id']}, {'SLURM requeue delay' if natural else 'StartTime=now+1'}): "
                    f"USR1->PENDING {t['pending_seen'] - t['usr1']:.2f} s, requeue->RUNNING {t['running_seen'] - t['requeue']:.2f} s, "
                    f"job_start->first new step {t['first_new_metrics_line'] - t['job_start']:.2f} s"
                )
    finally:
        cluster_note = cluster_down_if_idle(was_running)
    report(trials, cluster_note).emit()


if __name__ == "__main__":
    main()
