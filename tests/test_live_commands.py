"""The everyday commands against a real cluster (nats-server, scheduler and a host agent as
OS processes): jobs and queue say why a job waits and when it should start, submit
--dry-run changes nothing, nodes, shares, logs and history show what happened."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from agents.local_cluster import REPO, Cluster
from core import types as T
from xirang.cli import main

pytestmark = pytest.mark.timeout(120)

HELLO = f"{sys.executable} -c \"import time; print('hello from the job', flush=True); time.sleep(60)\""


def xirang(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys, *args: str) -> dict:
    code, out, err = xirang(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("commands")) as c:
        c.scheduler()
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        yield c


@pytest.fixture
def idle(cluster, capsys):
    """The one cluster with no open job: each test builds the jobs it reads itself, so it passes
    alone, in any order and after any other test of the file."""
    url = cluster.url
    for row in as_json(capsys, "jobs", "--nats", url)["jobs"]:
        code, out, err = xirang(capsys, "cancel", row["job"], "--nats", url, "--operator")
        assert code == 0, out + err
        cluster.wait_for(T.JobCancelled, job=row["job"])
    nodes = as_json(capsys, "nodes", "--nats", url)["nodes"]
    assert [(n["node"], n["free"]) for n in nodes] == [("h1", 8)]
    return cluster


def submit(capsys, cluster, job: str, *, team: str, user: str, level: int, gpus: int, **extra) -> None:
    """Submit `job` (extra options: est_runtime_s=600 -> --est-runtime-s 600) and check it is accepted."""
    options = [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
    code, out, err = xirang(
        capsys,
        "submit",
        job,
        "--nats",
        cluster.url,
        "--team",
        team,
        "--user",
        user,
        "--level",
        str(level),
        "--gpus",
        str(gpus),
        *options,
    )
    assert code == 0 and out.startswith("accepted"), out + err


def fill_pool(capsys, cluster, job: str, *, team: str = "vision", user: str = "ana") -> None:
    """Run `job` on all 8 GPUs of h1 at level 5 (printing a line, then sleeping a minute) and wait
    until it runs: from then on a job of level 5 or less urgent queues."""
    submit(capsys, cluster, job, team=team, user=user, level=5, gpus=8, est_runtime_s=600, command=HELLO)
    cluster.wait_for(T.JobRunning, job=job)


def test_a_waiting_job_says_why_and_when_it_should_start(idle, capsys):
    url = idle.url
    fill_pool(capsys, idle, "wait-big")
    submit(capsys, idle, "wait-small", team="nlp", user="bo", level=6, gpus=2, est_runtime_s=60)
    jobs = {r["job"]: r for r in as_json(capsys, "jobs", "--nats", url)["jobs"]}
    waiting = jobs["wait-small"]
    assert waiting["state"] == "queued" and waiting["reason_code"] and waiting["reason"]
    assert 0 < waiting["start_in_s"] <= 700
    queue = as_json(capsys, "queue", "--nats", url)
    assert [q["job"] for q in queue["levels"][6]["queued"]] == ["wait-small"]
    # The same reason, read a moment later: its countdown may have moved by a second.
    queued = queue["levels"][6]["queued"][0]
    assert queued["reason_code"] == waiting["reason_code"]
    assert re.sub(r"[0-9]+", "N", queued["reason"]) == re.sub(r"[0-9]+", "N", waiting["reason"])
    code, out, _ = xirang(capsys, "jobs", "--nats", url, "--team", "nlp")
    assert "wait-small" in out and "wait-big" not in out and "GPUs of H100" in out


def test_dry_run_tells_what_would_happen_and_submits_nothing(idle, capsys):
    url = idle.url
    fill_pool(capsys, idle, "dry-big")
    answer = as_json(
        capsys,
        "submit",
        "urgent-dry",
        "--nats",
        url,
        "--team",
        "safety",
        "--level",
        "1",
        "--gpus",
        "8",
        "--est-runtime-s",
        "60",
        "--dry-run",
    )
    # dry-big runs on every GPU with no checkpoint: an urgent one-minute job is worth preempting it
    # only if the decision model says so; either way the answer says why, in numbers.
    assert answer["outcome"] in ("preempts", "waits"), answer
    if answer["outcome"] == "preempts":
        assert [v["job"] for v in answer["victims"]] == ["dry-big"] and answer["benefit"] > answer["cost"]
    else:
        assert answer["reason"] and answer["start_in_s"] is not None
    print(answer["summary"], file=sys.stderr)
    code, out, _ = xirang(
        capsys,
        "submit",
        "never",
        "--nats",
        url,
        "--team",
        "safety",
        "--level",
        "1",
        "--gpus",
        "1",
        "--gpu-model",
        "B200",
        "--dry-run",
        "--json",
    )
    refused = json.loads(out)
    assert code == 1 and (refused["outcome"], refused["reason"]) == ("rejected", "no_node_of_model")
    jobs = as_json(capsys, "jobs", "--nats", url)["jobs"]
    assert [r["job"] for r in jobs] == ["dry-big"]


def test_nodes_shares_and_logs(idle, capsys):
    url = idle.url
    fill_pool(capsys, idle, "nodes-big")
    submit(capsys, idle, "nodes-small", team="nlp", user="bo", level=6, gpus=2)
    nodes = as_json(capsys, "nodes", "--nats", url)["nodes"]
    assert nodes == [
        {
            "node": "h1",
            "gpu_model": "H100",
            "gpus": 8,
            "used": 8,
            "free": 0,
            "jobs": ["nodes-big"],
            "state": "allocated",
            "cordoned_by": "",
            "cordon_reason": "",
        }
    ]
    # An operator cordons the node (Slurm's drain): its job runs on, the node says why.
    code, out, _ = xirang(
        capsys, "node", "cordon", "h1", "--reason", "PSU swap", "--nats", url, "--user", "ana"
    )
    assert code == 0 and out.startswith("accepted: cordon"), out
    (row,) = as_json(capsys, "nodes", "--nats", url)["nodes"]
    assert (row["state"], row["cordoned_by"], row["cordon_reason"], row["jobs"]) == (
        "cordoned",
        "op:ana",
        "PSU swap",
        ["nodes-big"],
    )
    code, out, _ = xirang(capsys, "nodes", "--nats", url)
    assert "h1 cordoned by op:ana: PSU swap" in out
    code, out, _ = xirang(capsys, "node", "cordon", "h9", "--reason", "x", "--nats", url)
    assert code == 1 and "rejected: unknown_node" in out
    code, out, _ = xirang(capsys, "node", "uncordon", "h1", "--nats", url)
    assert code == 0 and as_json(capsys, "nodes", "--nats", url)["nodes"][0]["state"] == "allocated"
    teams = {r["team"]: r for r in as_json(capsys, "shares", "--nats", url)["teams"]}
    assert teams["vision"]["held_gpus"] == 8 and teams["nlp"]["queued_gpus"] == 2
    assert teams["vision"]["fair_share_gpus"] + teams["nlp"]["fair_share_gpus"] == pytest.approx(8)
    # The job prints its line as it starts; the host writes it to the run's log a moment later.
    deadline = time.monotonic() + 20
    while True:
        code, out, err = xirang(capsys, "logs", "nodes-big", "--nats", url, "--data-dir", str(idle.root))
        if (code == 0 and "hello from the job" in out) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert code == 0 and "hello from the job" in out, out + err
    code, _, err = xirang(capsys, "logs", "no-such-job", "--nats", url, "--data-dir", str(idle.root))
    assert code == 2 and "no job no-such-job" in err


def test_history_shows_finished_jobs_with_filters(idle, capsys):
    url = idle.url
    fill_pool(capsys, idle, "hist-big")
    submit(capsys, idle, "hist-small", team="nlp", user="bo", level=6, gpus=2, command=HELLO)
    code, _, _ = xirang(capsys, "cancel", "hist-big", "--nats", url, "--operator")
    assert code == 0
    idle.wait_for(T.JobRunning, job="hist-small")
    rows = {r["job"]: r for r in as_json(capsys, "history", "--nats", url)["jobs"]}
    assert rows["hist-big"]["state"] == "cancelled" and rows["hist-small"]["state"] == "running"
    assert rows["hist-small"]["wait_s"] > 0
    cancelled = as_json(capsys, "history", "--nats", url, "--state", "cancelled")["jobs"]
    assert "hist-big" in [r["job"] for r in cancelled]
    assert sorted(r["job"] for r in cancelled) == sorted(
        j for j, r in rows.items() if r["state"] == "cancelled"
    )
    assert as_json(capsys, "history", "--nats", url, "--team", "nobody")["jobs"] == []
    assert as_json(capsys, "history", "--nats", url, "--since", "2999-01-01T00:00:00")["jobs"] == []
    assert len(as_json(capsys, "history", "--nats", url, "--until", "2999-01-01T00:00:00")["jobs"]) == len(
        rows
    )
    code, out, _ = xirang(capsys, "history", "--nats", url)
    assert "hist-big" in out and "cancelled" in out
    fail = f'{sys.executable} -c "import sys; sys.exit(3)"'
    submit(capsys, idle, "fail-1", team="nlp", user="bo", level=5, gpus=1, command=fail)
    idle.wait_for(T.JobFailed, job="fail-1")
    failed = as_json(capsys, "history", "--nats", url, "--state", "failed")["jobs"]
    assert [(r["job"], r["exit_code"]) for r in failed] == [("fail-1", 3)]


def test_hold_release_set_level_and_requeue(idle, capsys):
    url = idle.url
    # bo's own job holds every GPU, so `later` (8 GPUs, less urgent) can only queue.
    fill_pool(capsys, idle, "hold-runner", team="nlp", user="bo")
    submit(capsys, idle, "later", team="nlp", user="bo", level=7, gpus=8)
    code, out, _ = xirang(capsys, "hold", "later", "--nats", url, "--user", "bo")
    assert code == 0 and out.startswith("accepted")
    jobs = {r["job"]: r for r in as_json(capsys, "jobs", "--nats", url)["jobs"]}
    assert jobs["later"]["state"] == "held" and jobs["later"]["reason_code"] == "held"
    code, out, _ = xirang(capsys, "release", "later", "--nats", url, "--user", "cy")
    assert code == 1 and "rejected: not_your_job" in out
    code, out, _ = xirang(capsys, "set-level", "later", "6", "--nats", url, "--user", "bo")
    assert code == 1 and "raising_priority_needs_operator" in out
    code, out, _ = xirang(capsys, "set-level", "later", "6", "--nats", url, "--user", "ops", "--operator")
    assert code == 0, out
    code, _, _ = xirang(capsys, "release", "later", "--nats", url, "--user", "bo")
    assert code == 0
    jobs = {r["job"]: r for r in as_json(capsys, "jobs", "--nats", url)["jobs"]}
    assert jobs["later"]["state"] == "queued" and jobs["later"]["level"] == 6
    code, _, _ = xirang(capsys, "requeue", "hold-runner", "--nats", url, "--user", "bo")
    assert code == 0
    records = idle.wait_for(T.JobRequeued, job="hold-runner", reason="requeue_requested")
    assert [r for r in records if isinstance(r.event, T.JobStopRequested) and r.event.job == "hold-runner"]


def test_watch_redraws_and_logs_follow_ends_with_the_job(idle, capsys):
    url = idle.url
    ticker = f"{sys.executable} -c \"import time\nfor i in range(5): print('tick', i, flush=True); time.sleep(0.4)\""
    xirang(
        capsys,
        "submit",
        "ticker",
        "--nats",
        url,
        "--team",
        "nlp",
        "--level",
        "2",
        "--gpus",
        "1",
        "--command",
        ticker,
    )
    follow = subprocess.run(
        [
            sys.executable,
            "-m",
            "xirang.cli",
            "logs",
            "ticker",
            "--follow",
            "--nats",
            url,
            "--data-dir",
            str(idle.root),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert follow.returncode == 0, follow.stderr
    assert [line for line in follow.stdout.splitlines() if line.startswith("tick")] == [
        f"tick {i}" for i in range(5)
    ]
    watch = subprocess.Popen(
        [sys.executable, "-m", "xirang.cli", "queue", "--watch", "0.3", "--json", "--nats", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        frames = [json.loads(watch.stdout.readline()) for _ in range(2)]
        assert all(len(frame["levels"]) == 8 for frame in frames)
    finally:
        os.kill(watch.pid, signal.SIGINT)
        # communicate, not wait: it reads the pipes, so a full one cannot hold the exit up.
        try:
            _, err = watch.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.communicate()
            raise
        assert watch.returncode == 130 and "Traceback" not in err, err
