from ckpt_tool.core.claim_rules import Owner, decide, same_claim

ME = Owner("200", "nodeA", 10, 1000.0, 1000.0)


def owner(job="100", host="nodeB", pid=5, last_seen=990.0):
    return Owner(job, host, pid, 900.0, last_seen)


def test_refused_while_another_job_is_alive_and_says_who():
    d = decide(owner(), ME, now=1000.0, stale_after_s=120, pid_alive=None, take_over=False)
    assert not d.allowed
    assert d.reason == "job 100 on nodeB (pid 5), owner since 100 s, last seen 10 s ago"


def test_allowed_cases():
    assert decide(None, ME, 1000.0, 120, None, False).allowed
    assert decide(owner(job="200"), ME, 1000.0, 120, None, False).reason.startswith("same SLURM job")
    assert decide(owner(last_seen=500.0), ME, 1000.0, 120, None, False).reason.startswith("stale: not seen for 500 s")
    assert decide(owner(host="nodeA"), ME, 1000.0, 120, False, False).reason == "stale: the owner's process 5 is gone"
    assert decide(owner(), ME, 1000.0, 120, None, True).reason == "take-over requested"


def test_damaged_owner_file_is_no_owner():
    assert Owner.from_json({"host": "x"}) is None
    assert Owner.from_json("garbage") is None
    assert Owner.from_json(ME.to_json()) == ME


def test_same_claim_is_host_pid_and_claim_time_not_last_seen():
    mine = Owner("1", "h", 5, since=100.0, last_seen=100.0)
    assert same_claim(mine, Owner("1", "h", 5, since=100.0, last_seen=900.0))  # refreshed
    assert not same_claim(mine, Owner("1", "h", 5, since=200.0, last_seen=200.0))  # the pid reused by a new claim
    assert not same_claim(mine, Owner("2", "other", 5, since=100.0, last_seen=100.0))
