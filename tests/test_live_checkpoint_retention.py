"""An ended job's checkpoints leave the bus's store: the scheduler purges them from XR_CKPT
`ended_job_checkpoints_kept_s` after the job ends (a policy parameter), so a user submitting
many short checkpointing jobs cannot fill the store over time; a running job's checkpoints
stay. Real nats-server, scheduler, host agent and SDK training jobs as processes."""

from __future__ import annotations

import time

import pytest

from agents.local_cluster import Cluster, train_command
from core import types as T
from transport import checkpoints as ckptstore

pytestmark = pytest.mark.timeout(120)

KEPT_S = 4.0


def trainer(job: str, steps: int) -> T.Submit:
    return T.Submit(
        job=job,
        team="t",
        user="u",
        level=6,
        gpus=1,
        command=train_command(steps, ckpt_s=0.3, step_ms=20),
    )


def stored(c: Cluster) -> list[str]:
    async def go(nc, js):
        return await ckptstore.stored_jobs(js)

    return c._run(go)


def test_an_ended_jobs_checkpoints_are_purged_after_the_policys_time_and_a_running_ones_stay(tmp_path):
    with Cluster(tmp_path / "c", policy=f"ended_job_checkpoints_kept_s = {KEPT_S}\n") as c:
        c.scheduler()
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.send(trainer("long", 100_000), trainer("short", 60))
        c.wait_for(T.CheckpointRecorded, job="long", timeout_s=30)
        finished = c.wait_for(T.JobFinished, job="short", timeout_s=60)
        assert any(isinstance(r.event, T.CheckpointRecorded) and r.event.job == "short" for r in finished)
        ended_at = time.monotonic()
        # Within the policy's time after the end, the checkpoints are still there.
        assert "short" in stored(c) and "long" in stored(c)
        deadline = ended_at + KEPT_S + 20
        while "short" in stored(c):
            assert time.monotonic() < deadline, stored(c)
            time.sleep(0.3)
        assert time.monotonic() - ended_at >= KEPT_S - 1.0  # not before its time
        assert "long" in stored(c)  # still running: its checkpoints stay
        assert "purged the checkpoints of 1 job(s)" in (c.logs / "s1.log").read_text()
        c.send(T.Cancel(job="long"))
        c.wait_for(T.JobCancelled, job="long")
        deadline = time.monotonic() + KEPT_S + 20
        while "long" in stored(c):
            assert time.monotonic() < deadline, stored(c)
            time.sleep(0.3)
