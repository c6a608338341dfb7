"""A job writing facts without end into its outbox is held to its bounds (agents/outbox.py):
the facts beyond them are dropped, counted and reported, the log takes a bounded number of
them, and another job's start on the same host is reported at once. Real nats-server,
scheduler, host agent and job processes."""

from __future__ import annotations

import sys
import time

import pytest

from agents.local_cluster import Cluster
from agents.outbox import JOB_FACTS_BURST, JOB_FACTS_PER_S
from core import types as T

pytestmark = pytest.mark.timeout(150)

FACTS = 30_000
FLOODING = 2_000  # facts written before the other job is submitted: it starts mid-flood
FLOOD = (
    "import json, os, time\n"
    "box, job = os.environ['XR_OUTBOX'], os.environ['XR_JOB']\n"
    f"for i in range({FACTS}):\n"
    "    fact = {'type': 'checkpoint_started', 'job': job, 'id': f'flood-{i}'}\n"
    "    with open(os.path.join(box, f'{i:020d}-0000001-{i:06d}.fact.tmp'), 'w') as fh:\n"
    "        json.dump(fact, fh)\n"
    "    os.rename(fh.name, fh.name[:-4])\n"
    f"    if i == {FLOODING}:\n"
    "        open(os.path.join(os.environ['XR_JOB_DIR'], 'flooded'), 'w').close()\n"
    "time.sleep(120)\n"
)


def about(records, job: str) -> list[T.Record]:
    """The records of inputs about `job` (each accepted or rejected fact is one or more)."""
    return [
        r
        for r in records
        if isinstance(r.event, T.InputRejected)
        and r.event.job == job
        or isinstance(r.event, T.InputAccepted)
        and T.input_job(r.event.input) == job
    ]


def _start_latency_ms(records, job: str) -> int:
    """From the scheduler's start request to the host's report that `job` runs."""
    started = next(r for r in records if isinstance(r.event, T.JobStartRequested) and r.event.job == job)
    running = next(r for r in records if isinstance(r.event, T.JobRunning) and r.event.job == job)
    return running.event.t - started.event.t


def test_a_job_flooding_its_outbox_is_bounded_and_delays_no_other_start(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        # The same start on the same host before the flood: the machine's own pace, so the
        # bound below holds on a loaded machine and still fails when the flood delays starts.
        c.send(T.Submit(job="probe", team="t", user="u", level=5, gpus=1, command=["true"]))
        unflooded_ms = _start_latency_ms(c.wait_for(T.JobRunning, job="probe"), "probe")
        c.wait_for(T.JobFinished, job="probe")

        c.send(
            T.Submit(job="flood", team="t", user="u", level=5, gpus=1, command=[sys.executable, "-c", FLOOD])
        )
        c.wait_for(T.JobRunning, job="flood")
        deadline = time.monotonic() + 60
        while not list((tmp_path / "hosts").glob("h1/runs/flood*/flooded")):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        flooded_at = time.monotonic()
        c.send(T.Submit(job="other", team="t", user="u", level=5, gpus=1, command=["sleep", "30"]))
        flooded_ms = _start_latency_ms(c.wait_for(T.JobRunning, job="other", timeout_s=30), "other")
        # Before the bounds a flood delayed another start by 13 s; a loaded machine's spikes
        # stay well within this.
        assert flooded_ms < 5000 + 4 * unflooded_ms, (flooded_ms, unflooded_ms)
        time.sleep(2)
        elapsed_s = time.monotonic() - flooded_at + 60
        facts_taken = len({r.input_seq for r in about(c.records(), "flood")})
        assert facts_taken <= JOB_FACTS_BURST + JOB_FACTS_PER_S * elapsed_s + 5, facts_taken
        assert "dropped 1 fact(s) of job flood so far" in (c.logs / "h1.log").read_text()
        # The scheduler hears it in the host's heartbeats (a host may not alert on a secured bus).
        deadline = time.monotonic() + 10
        while "host h1 dropped" not in (c.logs / "s1.log").read_text():
            assert time.monotonic() < deadline, (c.logs / "s1.log").read_text()
            time.sleep(0.2)
