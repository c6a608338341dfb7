"""Integration tests against a real nats-server: a job's whole life through the CLI, the
bus's deduplication, and the fencing that keeps a stale writer out of the log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from transport import bus
from agents.local_cluster import REPO, Cluster, matching, sleep_command
from core import new_state, rebuild, step
from core import types as T

pytestmark = pytest.mark.timeout(120)


def xirang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        yield c


def test_submitted_job_starts_runs_and_finishes(cluster):
    command = f'{sys.executable} -c "import time; time.sleep(0.5)"'
    done = xirang(
        "submit",
        "j1",
        "--nats",
        cluster.url,
        "--team",
        "a",
        "--level",
        "3",
        "--gpus",
        "2",
        "--gpu-model",
        "H100",
        "--command",
        command,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("accepted: submit j1")
    records = cluster.wait_for(T.JobFinished, job="j1")
    start = matching(records, T.JobStartRequested, job="j1")[0].event
    assert start.nodes == ["h1"] and len(start.placement[0].gpus) == 2
    assert matching(records, T.JobRunning, job="j1")
    rebuild(records)  # the log verifies: hash chain and state digests

    jobs = xirang("jobs", "--nats", cluster.url, "--json")
    assert json.loads(jobs.stdout)["done"] == {"j1": "finished"}


def test_bad_submission_answers_with_the_reason_and_loses_nothing(cluster):
    bad = xirang("submit", "j2", "--nats", cluster.url, "--team", "a", "--level", "9", "--gpus", "1")
    assert bad.returncode == 1
    assert "rejected: level_must_be_0_to_7" in bad.stdout
    never = xirang("submit", "j4", "--nats", cluster.url, "--team", "a", "--level", "7", "--gpus", "64")
    assert never.returncode == 1 and "rejected: gang_larger_than_pool" in never.stdout
    assert "ask for at most 8" in never.stdout
    good = xirang(
        "submit", "j3", "--nats", cluster.url, "--team", "a", "--level", "7", "--gpus", "8", "--json"
    )
    assert json.loads(good.stdout)["outcome"] == "accepted"
    jobs = json.loads(xirang("jobs", "--nats", cluster.url, "--json").stdout)
    assert [r["job"] for r in jobs["jobs"]] == ["j3"]


def test_duplicated_input_is_applied_once(cluster):
    inp = T.Submit(job="dup", team="a", user="u", level=5, gpus=1, id="client-42", command=sleep_command(30))
    first, second = cluster.send(inp, inp)
    assert not first[2] and second[2] and first[1] == second[1]
    cluster.wait_for(T.JobRunning, job="dup")
    records = cluster.records()
    assert len(matching(records, T.JobSubmitted, job="dup")) == 1
    assert not matching(records, T.InputRejected, job="dup")
    cluster.send(T.Cancel(job="dup"))
    cluster.wait_for(T.JobCancelled, job="dup")


def test_client_without_a_server_gets_a_clear_error(tmp_path):
    done = xirang("jobs", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert "no NATS server" in done.stderr


def test_stale_writer_is_fenced_and_appends_nothing(tmp_path):
    with Cluster(tmp_path) as c:

        async def go():
            nc, js = await bus.connect(c.url)
            await bus.ensure_streams(js)
            state = new_state()
            _, recs = step(state, T.NodeUp(t=1, node="n", gpu_model="H100", gpus=8, seq=1))
            last = await bus.publish_atomic(nc, bus.record_messages(recs), 0, "w1")
            _, more = step(state, T.Submit(t=2, job="j", team="a", user="u", level=1, gpus=1, seq=2))
            with pytest.raises(bus.FencingError):
                await bus.publish_atomic(nc, bus.record_messages(more), 0, "stale")
            assert await bus.stream_last_seq(js, bus.EV_STREAM) == last
            await nc.close()

        asyncio.run(go())
