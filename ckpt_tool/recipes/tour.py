"""``make tour``: the whole chain on the local SLURM cluster, in a few minutes, narrated.

One job of the reference recipe on three nodes (n1-n3 of ``.ci/slurm-up``, one rank each):

1. ``ckpt submit`` it (``--nodes 3 --min-nodes 2``);
2. a preemption: the time-limit warning (USR1) -> a checkpoint at the next step, ``scontrol
   requeue``;
3. while it waits, its newest checkpoint is silently corrupted (one bit of one shard: the sizes
   are right) -> at the next start the ranks' hash check finds it, it is quarantined and every
   rank rolls back to the previous checkpoint together;
4. node n3 goes bad from that start on (the recipe's injected ECC error, a few steps into every
   start) -> blamed twice in a row, left behind: the job goes on with two nodes and the same
   global batch;
5. ``ckpt history`` (the timeline and the account of the run's time: its interruptions, the steps
   recomputed, the time down, the ETTR), ``ckpt verify`` of the final checkpoint, and the story as
   a picture on a wall clock (``ckpt history --plot``), whose path it prints.

Exit 0 when every act happened as told, else 1 with the job's output. The job is cancelled on
the way out whatever happened. ``python -m ckpt_tool.recipes.tour --work DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ckpt_tool.core import layout
from ckpt_tool.recipes.launch import FAST_ARGS, ckpt_submit_command, read_metrics, recipe_args
from ckpt_tool.store.store import CheckpointStore

STEPS, SAVE_EVERY = 40, 5
BATCH = ("--micro-batch", "4", "--grad-accum", "1", "--dropout", "0")  # global batch 12 on 3 ranks, 2 x 6 on 2
NODES = ("--nodes", "3", "--min-nodes", "2", "--nproc-per-node", "1", "--time", "20:00", "--env", "OMP_NUM_THREADS=1")
BUDGET_S = 300.0

console = Console(highlight=False)


class TourFailed(Exception):
    """An act of the tour did not happen as told; its message says which and what was seen (``main`` prints it and
    the job's output, exit 1)."""


def sh(*argv: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion, output captured as text; raises ``subprocess.TimeoutExpired`` after ``timeout``
    seconds."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def ckpt(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run this interpreter's ``ckpt`` CLI with ``args`` (as ``sh``; 300 s by default)."""
    return sh(sys.executable, "-m", "ckpt_tool.cli.main", *args, timeout=timeout)


class Tour:
    """One tour's state: its work directory (``ckpt/``, ``metrics.jsonl``, ``story.png``), the SLURM job id once
    submitted, and the start time its narration counts from. The acts run in order and raise ``TourFailed``."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.ckpt_dir, self.metrics = work / "ckpt", work / "metrics.jsonl"
        self.job = ""
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ narration
    def act(self, title: str) -> None:
        """Print an act's heading with the seconds since the tour started."""
        console.rule(f"[bold]{escape(title)}[/]  [dim]{time.monotonic() - self.t0:.0f} s[/]")

    def say(self, text: str) -> None:
        """Print one line of narration (Rich markup: the caller escapes what came from the disk)."""
        console.print(f"  {text}", soft_wrap=True)

    def show(self, cmd: list[str]) -> None:
        """Print the command about to run, escaped, as the user would type it."""
        console.print(f"  [cyan]$ {escape(' '.join(cmd))}[/]", soft_wrap=True)

    # ------------------------------------------------------------------ the job
    def output(self) -> str:
        """The job's ``slurm-JOB.out`` so far (empty before it exists)."""
        path = self.ckpt_dir / layout.RUN_DIR_NAME / f"slurm-{self.job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def state(self) -> str:
        """The job's state in ``squeue`` (e.g. ``RUNNING``, ``PENDING``); empty once it left the queue."""
        return sh("squeue", "-h", "-j", self.job, "-o", "%T").stdout.strip()

    def wait_for(self, done: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Poll ``done`` every 0.3 s until true; raises ``TourFailed`` naming ``what`` and the job's state after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.3)
        raise TourFailed(f"{what} did not happen in {timeout:.0f} s (job state {self.state()!r})")

    def step_reached(self, step: int) -> bool:
        """Whether rank 0 logged ``step`` (or a later one) in the metrics file."""
        return self.metrics.exists() and any(m.step >= step for m in read_metrics(self.metrics))

    def events(self) -> list:
        """The store's index events, or an empty list before the first checkpoint wrote the index."""
        return CheckpointStore(self.ckpt_dir).events() if (self.ckpt_dir / layout.INDEX_NAME).exists() else []

    def release(self) -> None:
        """A requeued job waits cred_expire seconds before it may run again: start it now."""
        self.wait_for(lambda: self.state() in ("PENDING", ""), "the requeue")
        if self.state() == "PENDING":
            sh("scontrol", "update", f"JobId={self.job}", "StartTime=now+1")

    # ------------------------------------------------------------------ the acts
    def submit(self) -> None:
        """Act 1: ``ckpt submit`` the recipe on 3 nodes (n3's fault armed for after the requeue), keep the job id, wait
        until step 12. Raises ``TourFailed`` when the submit fails or training does not get there."""
        self.act("1. ckpt submit: the reference recipe on 3 nodes")
        args = recipe_args(self.ckpt_dir, self.metrics, STEPS, SAVE_EVERY, *FAST_ARGS, *BATCH)
        args += ["--fail-on-node", "n3", "--fail-after-steps", "4", "--fail-from-restart", "1"]  # n3 goes bad after the requeue
        cmd = ckpt_submit_command(self.ckpt_dir, args, NODES)
        self.show(["ckpt", *cmd[3:]])
        done = sh(*cmd)
        if done.returncode != 0:
            raise TourFailed(f"ckpt submit failed: {done.stderr.strip()}")
        self.job = done.stdout.splitlines()[0].strip()
        self.say(f"job {self.job}: one `ckpt run` per node, torchrun under a watchdog, a checkpoint every {SAVE_EVERY} steps")
        self.wait_for(lambda: self.step_reached(12), "training to step 12", timeout=150)
        self.say(f"training: step {read_metrics(self.metrics)[-1].step} of {STEPS}")

    def preempt(self) -> None:
        """Act 2: send the batch script USR1 once it is ready and wait for the requeue; remembers the newest
        checkpoint step (``self.latest``) for act 3."""
        self.act("2. a preemption: the time-limit warning (USR1)")
        self.wait_for(lambda: "ready: trap installed" in self.output(), "the batch script's readiness")
        cmd = ["scancel", "--signal=USR1", "--batch", self.job]
        self.show(cmd)
        sh(*cmd)
        self.wait_for(lambda: "requeuing" in self.output(), "the requeue")
        latest = CheckpointStore(self.ckpt_dir).read_latest()
        self.say(f"the ranks checkpointed step {latest} at the next step boundary; the script ran `scontrol requeue`")
        self.latest = latest

    def corrupt(self) -> None:
        """Act 3: flip one bit of a shard of the newest checkpoint (same size), release the job and wait for its
        quarantine and the ranks' resume from an earlier step."""
        self.act("3. while it waits: the newest checkpoint silently corrupted")
        store = CheckpointStore(self.ckpt_dir)
        shard = store.step_path(self.latest) / "__1_0.distcp"
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0x08
        shard.write_bytes(bytes(raw))
        self.say(f"flipped one bit in the middle of {shard.relative_to(self.work)} (same size: a structure check cannot see it)")
        self.release()
        self.wait_for(lambda: any(e.event == "quarantine" for e in self.events()), "the damaged checkpoint's quarantine", timeout=150)
        [q] = [e for e in self.events() if e.event == "quarantine"]
        self.say(
            f"at the next start the ranks hashed the files as they loaded them: step {q.step} quarantined ({escape(str(q.data.get('reason', ''))[:110])}...)"
        )
        self.wait_for(lambda: "resumed" in {e.get("event") for e in _run_events(self.ckpt_dir)}, "the resume")
        resumed = [e for e in _run_events(self.ckpt_dir) if e.get("event") == "resumed"]
        self.say(f"every rank rolled back together and resumed from step {resumed[-1].get('checkpoint')}")

    def node_fault(self) -> None:
        """Act 4: wait for n3 to be left behind and the training to finish on two nodes with the same global batch;
        raises ``TourFailed`` when the job ends unfinished."""
        self.act("4. a node that keeps failing: n3")
        self.wait_for(lambda: "left n3 behind" in self.output(), "leaving n3 behind", timeout=180)
        crashed = [e for e in _run_events(self.ckpt_dir) if e.get("event") == "rank_exited" and e.get("cause") == "crashed"]
        self.say(
            f"n3's rank failed {len(crashed)} times in a row ({escape(str(crashed[-1].get('reason', ''))[:80])}...), its peers only as victims"
        )
        self.say("the health ledger made n3 suspect; `ckpt nodes` told the script to shrink: scontrol update NodeList=n[1-2]")
        self.wait_for(lambda: self.state() == "", "the end of the training", timeout=180)
        if "training finished" not in self.output():
            raise TourFailed("the job ended without finishing its training")
        final = CheckpointStore(self.ckpt_dir).read_manifest(STEPS)
        assert final.batch is not None
        self.say(
            f"finished on {final.world_size} nodes: step {STEPS}, global batch {final.batch.global_batch} "
            f"(= {final.batch.dp_size} ranks x {final.batch.micro_batch} x {final.batch.grad_accum} micro-batches), as on 3 nodes"
        )

    def epilogue(self) -> Path:
        """Act 5: ``ckpt history``, ``ckpt verify --nproc 2`` of the final step and ``ckpt history --plot``; returns
        the picture's path. Raises ``TourFailed`` when any of the three fails."""
        self.act("5. the story: ckpt history, ckpt verify, the picture")
        self.show(["ckpt", "history", str(self.ckpt_dir), "--json"])
        history = ckpt("history", str(self.ckpt_dir), "--json")
        if history.returncode != 0:
            raise TourFailed(f"ckpt history failed: {history.stderr[-1500:]}")
        told = json.loads(history.stdout)
        for line in story_lines(told["events"]):
            console.print(f"    {escape(line)}", soft_wrap=True)
        acct = told["account"]
        self.say(f"where the time went: [bold]{escape(acct['summary'])}[/]")
        spent = ", ".join(f"{kind} {seconds:.1f} s" for kind, seconds in acct["seconds"].items() if seconds > 0)
        self.say(f"  {acct['wall_s']:.0f} s of wall time: {escape(spent)}")
        for i in acct["interruptions"]:
            then = f"; {'; '.join(i['then'])}" if i["then"] else ""
            self.say(
                f"  {i['index'] + 1}. {escape(i['label'])}: {i['down_s']:.1f} s down, {i['steps_recomputed']} steps redone{escape(then)}"
            )
        cmd = ["verify", str(self.ckpt_dir), "--nproc", "2", "--json"]  # the saved mesh: an exact check
        self.show(["OMP_NUM_THREADS=1", "ckpt", *cmd])
        verify = sh(sys.executable, "-m", "ckpt_tool.cli.main", *cmd, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        report = json.loads(verify.stdout) if verify.stdout.strip().startswith("{") else {}
        if verify.returncode != 0 or not report.get("ok"):
            raise TourFailed(f"ckpt verify of the final checkpoint failed: {verify.stdout[-1500:]} {verify.stderr[-1500:]}")
        checks = ", ".join(c["name"] for c in report["checks"])
        how = "bit for bit" if report.get("exact") else "within tolerance"
        self.say(f"step {report['step']} loads into a fresh model and reproduces its recorded {checks} {how}")
        picture = self.work / "story.png"
        cmd = ["history", str(self.ckpt_dir), "--plot", str(picture), "--metrics", str(self.metrics)]
        self.show(["ckpt", *cmd])
        drawn = ckpt(*cmd)
        if drawn.returncode != 0 or not picture.exists():
            raise TourFailed(f"drawing the picture failed: {drawn.stderr[-1500:]}")
        return picture


STORY_EVENTS = ("commit", "requeue", "quarantine", "resumed", "rank_exited", "nodes_left_behind", "shrunk", "job_finished")


def story_lines(events: list[dict]) -> list[str]:
    """The timeline's turning points, one short line each (a rank-level event once per attempt)."""
    out, seen = [], set()
    for e in events:
        name = e.get("event")
        if name not in STORY_EVENTS or (name == "rank_exited" and e.get("cause") in ("peer_failure", "terminated")):
            continue
        key = (name, e.get("round"), e.get("attempt"))
        if name in ("resumed", "rank_exited") and key in seen:
            continue
        seen.add(key)
        detail = _detail(str(name), e)
        out.append(f"{time.strftime('%H:%M:%S', time.localtime(e['time']))}  {name:<18} {detail}")
    return out


def _detail(name: str, e: dict) -> str:
    if name == "commit":
        return f"step {e.get('step')} ({e.get('mesh')}, probe loss {e.get('probe_loss', 0):.3f})"
    if name == "requeue":
        return str(e.get("reason", ""))
    if name == "quarantine":
        return f"step {e.get('step')}: {str(e.get('reason', ''))[:70]}"
    if name == "resumed":
        return f"from step {e.get('checkpoint')}"
    if name == "rank_exited":
        return f"{e.get('node')} rank {e.get('rank')} {e.get('cause')} at step {e.get('step')}"
    if name == "nodes_left_behind":
        return f"{e.get('action')}: drop {e.get('drop')}, keep {e.get('keep')}"
    if name == "shrunk":
        return f"now {e.get('nodes')}"
    return ""


def _run_events(ckpt_dir: Path) -> list[dict]:
    from ckpt_tool.supervise.run_dir import read_events

    return read_events(ckpt_dir / layout.RUN_DIR_NAME)


def main(argv: list[str] | None = None) -> int:
    """``python -m ckpt_tool.recipes.tour``: 2 without the local SLURM cluster (n1-n3), 1 when an act failed or the
    tour took over ``BUDGET_S`` seconds, else 0. Empties ``--work`` first; cancels the job on the way out."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("tour-out"), help="where the run's files go (emptied first)")
    args = parser.parse_args(argv)
    if sh("sinfo", "-h", "-o", "%n").returncode != 0 or not {"n1", "n2", "n3"} <= set(sh("sinfo", "-h", "-N", "-o", "%N").stdout.split()):
        console.print(
            "[red]error:[/] the tour needs the local SLURM cluster with nodes n1-n3: run `make slurm-up` (as root with apt), then `make tour`"
        )
        return 2
    import shutil

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    tour = Tour(args.work.resolve())
    try:
        tour.submit()
        tour.preempt()
        tour.corrupt()
        tour.node_fault()
        picture = tour.epilogue()
    except (TourFailed, subprocess.TimeoutExpired, AssertionError) as exc:
        console.print(f"[red]the tour stopped:[/] {escape(str(exc))}")
        console.print(escape(tour.output()[-3000:]))
        return 1
    finally:
        if tour.job:
            sh("scancel", tour.job)
    elapsed = time.monotonic() - tour.t0
    console.rule(f"[bold green]done in {elapsed:.0f} s[/]")
    console.print(f"  the picture of the whole story: [bold]{escape(str(picture))}[/]")
    console.print(f"  the run: {escape(str(tour.ckpt_dir))} (`ckpt status`, `ckpt history`, `ckpt list` on it)")
    return 0 if elapsed <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
