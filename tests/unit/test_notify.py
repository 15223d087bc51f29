"""``--notify CMD``: which events notify and what the JSON says (core/notify.py, plain data); the
command run bounded (slurm/notify.py, real ``sh``); the value carried into the batch script
through its quoting (``ckpt submit``, a hostile command read back by bash)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ckpt_tool.core.notify import (
    NOTIFIABLE_EVENTS,
    NOTIFY_EVENTS,
    JobContext,
    NotifyConfig,
    failure_detail,
    failure_reason,
    message,
    notify_env,
    output_tail,
    parse_events,
    payload,
)
from ckpt_tool.core.render import render
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.slurm.chain import Notify, failed, note, told
from ckpt_tool.slurm.notify import Notifier, run_command
from ckpt_tool.slurm.submit import notify_config, prepare, template

CTX = JobContext("41", 1, "/shared/ck", "/shared/ck/run", ("n1", "n2"), "n1")
HOSTILE = """curl -sS -d @- 'https://hooks.example/$TOKEN?a=1&b=2' | tee -a "out file" >/dev/null; echo "it's $(date) `id`" """


# --------------------------------------------------------------------------- which events, what they say


def test_the_default_events_are_the_ends_a_cancellation_and_the_nodes_and_requeue_may_be_added():
    assert NOTIFY_EVENTS == {
        "job_finished", "job_failed", "cancelled", "job_stopped", "max_requeues_reached", "requeue_failed", "nodes_left_behind", "replaced",
    }  # fmt: skip
    assert NOTIFIABLE_EVENTS == NOTIFY_EVENTS | {"requeue"}
    assert parse_events([]) == NOTIFY_EVENTS
    assert parse_events(["job_finished,job_failed", " requeue "]) == {"job_finished", "job_failed", "requeue"}
    with pytest.raises(CkptError) as bad:
        parse_events(["job_finished,job_start"])
    assert bad.value.exit_code == ExitCode.USAGE and "job_start" in bad.value.message and "job_failed" in bad.value.hint


def test_every_notifiable_event_is_a_run_event_of_the_catalog():
    from ckpt_tool.core.run_catalog import RUN_EVENTS

    assert NOTIFIABLE_EVENTS <= {e.name for e in RUN_EVENTS}
    assert "notify_failed" in {e.name for e in RUN_EVENTS}


@pytest.mark.parametrize(
    "rc, reason",
    [
        (76, "crash_loop"),
        (78, "save_failed"),
        (1, "restarts_exhausted"),
        (79, "reproducible_anomaly"),
        (3, "no_valid_checkpoint"),
        (137, "exit_137"),
    ],
)
def test_a_failed_jobs_reason_comes_from_ckpt_runs_exit_code(rc, reason):
    assert failure_reason(rc) == reason


@pytest.mark.parametrize(
    "command, says",
    [("", "is empty"), ("   ", "is empty"), ("a\nb", "not one command line"), ("a\rb", "not one command line")],
)
def test_a_command_that_is_not_one_line_is_refused(command, says):
    with pytest.raises(CkptError) as bad:
        NotifyConfig(command)
    assert bad.value.exit_code == ExitCode.USAGE and says in bad.value.message and "--notify" in bad.value.hint


def test_a_timeout_below_a_tenth_of_a_second_and_options_without_a_command_are_refused():
    with pytest.raises(CkptError, match="--notify-timeout 0 must be at least 0.1 s"):
        NotifyConfig("true", timeout_s=0)
    with pytest.raises(CkptError, match="need --notify CMD"):
        notify_config(None, ["job_failed"])
    assert notify_config(None) is None
    assert notify_config("cat", ["job_failed"], 5) == NotifyConfig("cat", frozenset({"job_failed"}), 5.0)


def test_a_crash_loops_payload_names_the_job_the_reason_and_the_next_command():
    _, told_ = failed(76)
    data = payload(told_.event, dict(told_.fields), CTX, 1700000000.5)
    assert data == {
        "version": 1,
        "event": "job_failed",
        "exit_code": "76",
        "reason": "crash_loop",
        "job_id": "41",
        "restart": 1,
        "ckpt_dir": "/shared/ck",
        "run_dir": "/shared/ck/run",
        "nodes": ["n1", "n2"],
        "host": "n1",
        "time": 1700000000.5,
        "message": "job 41 failed: a crash loop: failures in a row without a new checkpoint (exit 76); not requeued (/shared/ck)",
        "next": "ckpt status /shared/ck",
    }
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize(
    "event, fields, words",
    [
        ("job_finished", {}, "job 41 finished: the training ended (/shared/ck)"),
        ("job_failed", {"exit_code": "78", "reason": "save_failed"}, "job 41 failed: saves kept failing (the disk"),
        ("job_failed", {"exit_code": "3", "reason": "recover_failed"}, "job 41 failed: ckpt recover failed before training (exit 3)"),
        ("cancelled", {"cause": "scancel"}, "job 41 cancelled (scancel): checkpointing, then stopping; not requeued"),
        ("job_stopped", {"cause": "scancel"}, "job 41 stopped after its checkpoint (scancel); not requeued"),
        ("max_requeues_reached", {"restarts": "3", "limit": "3"}, "max requeues reached (3 of 3); resume it with ckpt submit"),
        ("requeue_failed", {"reason": "no-scontrol"}, "job 41 could not be requeued (no-scontrol)"),
        ("nodes_left_behind", {"action": "shrink", "drop": "n2", "keep": "n1"}, "job 41 left n2 behind: going on with n1"),
        ("nodes_left_behind", {"action": "requeue", "drop": "n2", "keep": "n1"}, "too few healthy nodes, requeued without them"),
        ("replaced", {"action": "replace", "drop": "n2,n4", "replaced": "n2:n3"}, "job 41 replaced n2 with n3 (a hot spare took each slot); also left behind: n4"),
        ("requeue", {"restarts": "1", "reason": "stopped by USR1"}, "job 41 requeued (restart 1): stopped by USR1"),
    ],
)  # fmt: skip
def test_each_events_message_says_what_happened_in_one_line(event, fields, words):
    said = message(event, fields, CTX)
    assert words in said and "\n" not in said


def test_the_chains_comma_lists_are_json_lists_and_a_field_never_hides_the_jobs_own():
    data = payload("nodes_left_behind", {"action": "shrink", "drop": "n2,n3", "keep": "n1", "exclude": "-", "job_id": "x"}, CTX, 0.0)
    assert (data["drop"], data["keep"], data["exclude"], data["job_id"]) == (["n2", "n3"], ["n1"], [], "41")
    odd = replace(CTX, ckpt_dir="/data/it's here")
    assert shlex.split(payload("job_finished", {}, odd, 0.0)["next"]) == ["ckpt", "status", "/data/it's here"]


def test_a_failures_detail_is_the_exit_or_the_timeout_and_the_outputs_tail():
    assert failure_detail(0, "ok", 30) is None
    assert failure_detail(3, "curl: (6) Could not resolve host\n", 30) == "exit 3: curl: (6) Could not resolve host"
    assert failure_detail(None, "", 2.5) == "timed out after 2.5 s (killed)"
    assert output_tail("a\n\nb\n") == "a | b"
    assert output_tail("x" * 1000).startswith("...") and len(output_tail("x" * 1000)) == 300


def test_the_chain_tells_what_it_records():
    recorded, said = told(note("cancelled", cause="scancel", requeued="no", restarts=1))
    assert said == Notify("cancelled", (("cause", "scancel"), ("requeued", "no"), ("restarts", "1")))
    assert recorded.fields == said.fields
    note_, notify_ = failed(3, "recover_failed")
    assert dict(note_.fields) == {"exit_code": "3"}  # the event log's fields stay the catalog's
    assert dict(notify_.fields) == {"exit_code": "3", "reason": "recover_failed"}


# --------------------------------------------------------------------------- running the command


def test_the_command_reads_one_json_line_on_stdin_through_a_pipe(tmp_path):
    out = tmp_path / "got.jsonl"
    result = run_command(
        f"cat | tee -a '{out}' >/dev/null; echo \"done $CKPT_X\"", {"event": "job_finished"}, 10, {"CKPT_X": "42", "PATH": "/usr/bin:/bin"}
    )
    assert (result.exit_code, result.output) == (0, "done 42\n")
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"event": "job_finished"}]


def test_a_failing_command_reports_its_exit_and_output():
    result = run_command("echo 'no route to host' >&2; exit 3", {"event": "x"}, 10)
    assert result.exit_code == 3 and "no route to host" in result.output


def test_a_hanging_pipeline_is_killed_whole_at_its_timeout():
    started = time.monotonic()
    result = run_command("sleep 100 | sleep 100", {"event": "x"}, 0.5)
    assert result.exit_code is None and time.monotonic() - started < 5


def test_a_command_that_does_not_read_stdin_is_fine():
    assert run_command("exit 0", {"event": "x" * 200000}, 10).exit_code == 0


def test_the_notifier_runs_only_the_events_asked_for_in_order_and_records_a_failure(tmp_path):
    out, lines = tmp_path / "got", []
    cfg = NotifyConfig(f"cat >> '{out}'; test \"$CKPT_NOTIFY_EVENT\" != job_failed", frozenset({"cancelled", "job_failed"}))
    notifier = Notifier(cfg, tmp_path / "run", lambda: CTX, lines.append, {"PATH": "/usr/bin:/bin", "CKPT_NOTIFY": "secret"})
    assert not notifier.send("job_finished", {})
    assert notifier.send("cancelled", {"cause": "scancel"}) and notifier.send("job_failed", {"exit_code": "76", "reason": "crash_loop"})
    notifier.close()
    assert [json.loads(line)["event"] for line in out.read_text().splitlines()] == ["cancelled", "job_failed"]
    (failure,) = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert (failure["event"], failure["for_event"], failure["exit_code"], failure["detail"]) == ("notify_failed", "job_failed", 1, "exit 1")
    assert lines[0].startswith("notified cancelled (") and lines[1].startswith("notify job_failed failed: exit 1; the job goes on")
    assert "CKPT_NOTIFY" not in notifier.env


# --------------------------------------------------------------------------- into the batch script


def test_submit_puts_a_hostile_command_into_the_script_and_bash_reads_it_back_unchanged(tmp_path):
    marker = tmp_path / "pwned"
    command = HOSTILE + f"; $(touch {marker})"
    spec, script = prepare(
        ["train.py"], tmp_path / "ck", check_command=False, notify=command, notify_on=["job_failed", "requeue"], notify_timeout_s=5
    )
    assert ("CKPT_NOTIFY", command) in spec.env and ("CKPT_NOTIFY_ON", "job_failed,requeue") in spec.env
    assert ("CKPT_NOTIFY_TIMEOUT", "5") in spec.env
    got = tmp_path / "env.json"
    recorder = (
        f"import json, os; json.dump({{k: v for k, v in os.environ.items() if k.startswith('CKPT_NOTIFY')}}, open({str(got)!r}, 'w'))"
    )
    script = render(replace(spec, ckpt=(sys.executable, "-c", recorder)), template())
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    subprocess.run(["bash", "-c", script], check=True, timeout=30, cwd=tmp_path)
    assert json.loads(got.read_text()) == {"CKPT_NOTIFY": command, "CKPT_NOTIFY_ON": "job_failed,requeue", "CKPT_NOTIFY_TIMEOUT": "5"}
    assert not marker.exists()


def test_the_defaults_add_only_the_command_and_env_cannot_set_it_twice():
    cfg = NotifyConfig("cat")
    assert notify_env((("A", "1"),), cfg) == (("A", "1"), ("CKPT_NOTIFY", "cat"))
    with pytest.raises(CkptError, match="--env CKPT_NOTIFY and --notify"):
        notify_env((("CKPT_NOTIFY", "x"),), cfg)


def _ckpt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpt_tool.cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_submit_refuses_an_empty_notify_before_anything_and_a_dry_run_shows_the_command(tmp_path):
    (tmp_path / "train.py").write_text("")
    bad = _ckpt("submit", "--ckpt-dir", str(tmp_path / "ck"), "--notify", "", "--dry-run", "--", "train.py", cwd=tmp_path)
    assert bad.returncode == 2 and "--notify is empty" in bad.stderr and "curl" in bad.stderr
    assert not (tmp_path / "ck").exists()
    shown = _ckpt("submit", "--ckpt-dir", str(tmp_path / "ck"), "--notify", "cat >> '$HOME/x'", "--dry-run", "--", "train.py", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "export CKPT_NOTIFY='cat >> '\"'\"'$HOME/x'\"'\"''\n" in shown.stdout
    as_json = _ckpt("submit", "--ckpt-dir", str(tmp_path / "ck"), "--notify", "cat", "--dry-run", "--json", "--", "train.py", cwd=tmp_path)
    assert json.loads(as_json.stdout)["notify"] == "cat"
