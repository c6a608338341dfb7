"""Outages are waited out: with a job checkpointing, nats-server is SIGKILLed for 30 s and
restarted on the same store. Nothing exits, the job runs on and finishes, its facts wait
in the host's outbox, a later job starts, and the log audits."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from transport.natsd import EmbeddedNats
from agents.local_cluster import REPO, Cluster, matching, sleep_command, train_command
from core import types as T

pytestmark = pytest.mark.timeout(180)

OUTAGE_S = 30


def audit(url: str, keys) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "xirang.cli",
            "audit",
            "--nats",
            url,
            "--json",
            "--public-key",
            str(keys / "scheduler.pub"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_a_30_second_nats_outage_is_waited_out_and_nothing_is_lost(tmp_path):
    with Cluster(tmp_path, node_timeout_ms=5000) as c:
        sched = c.scheduler("s1")
        agent = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        # About 45 s of training, a checkpoint every second: it runs across the outage.
        c.send(
            T.Submit(
                job="train",
                team="ml",
                user="ana",
                level=3,
                gpus=2,
                gpu_models=["H100"],
                est_runtime_s=60,
                command=train_command(4500, step_ms=10, ckpt_s=1),
            )
        )
        c.wait_for(T.CheckpointRecorded, job="train", timeout_s=30)
        port = c.nats.port
        c.nats.kill()
        time.sleep(OUTAGE_S)
        assert sched.poll() is None and agent.poll() is None, "a process exited during the outage"
        c.nats = EmbeddedNats(c.root / "nats", port=port).start()
        records = c.wait_for(T.JobFinished, job="train", timeout_s=90)
        assert not matching(records, T.JobFailed), "the job failed across the outage"
        assert not matching(records, T.NodeLost), "the host was declared lost for the bus's outage"
        c.send(
            T.Submit(
                job="after",
                team="ml",
                user="ana",
                level=3,
                gpus=1,
                gpu_models=["H100"],
                est_runtime_s=5,
                command=sleep_command(0.2),
            )
        )
        c.wait_for(T.JobFinished, job="after", timeout_s=30)
        assert sched.poll() is None and agent.poll() is None
        summary = audit(c.url, c.root / "keys")
        assert summary.get("problem") in (None, ""), summary
        assert not list((c.root / "h1" / "outbox").glob("*.fact")), "facts left undelivered"
