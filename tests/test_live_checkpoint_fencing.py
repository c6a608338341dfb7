"""Checkpoints are fenced by run: a run whose host agent is paused past the node timeout
keeps training and saving while its job is resumed elsewhere, yet it never overwrites the
checkpoint the resume was told of (each run writes only in slots of its own, and reuses one
only once a newer checkpoint's report has left its outbox). The resume restores exactly
the recorded step."""

from __future__ import annotations

import os
import signal
import time

import pytest

from agents.local_cluster import Cluster, matching, train_command
from agents.runfolders import run_folders
from core import types as T

pytestmark = pytest.mark.timeout(120)


def test_a_run_given_away_while_its_agent_is_paused_cannot_spoil_the_checkpoint_its_resume_reads(tmp_path):
    with Cluster(tmp_path, node_timeout_ms=3000) as cluster:
        cluster.scheduler()
        h1 = cluster.agent("h1", "8xH100")
        cluster.wait_for(T.NodeJoined, node="h1")
        cluster.send(
            T.Submit(
                job="t",
                team="a",
                user="u",
                level=5,
                gpus=8,
                gpu_models=["H100"],
                est_runtime_s=600,
                command=train_command(100_000, step_ms=10, ckpt_s=0.3),
            )
        )
        cluster.wait_for(T.CheckpointRecorded, job="t", count=2, timeout_s=30)
        cluster.agent("h2", "8xH100")
        cluster.wait_for(T.NodeJoined, node="h2")
        os.kill(h1.pid, signal.SIGSTOP)
        try:
            records = cluster.wait_for(T.JobResumeRequested, job="t", timeout_s=30)
            resume = matching(records, T.JobResumeRequested, job="t")[0]
            assert resume.event.nodes == ["h2"]
            # The old run saves on meanwhile (it has not been told): give it many intervals.
            time.sleep(6)
            records = cluster.wait(
                lambda rs: len(matching(rs, T.JobRunning, job="t")) >= 2, 30, "t running again on h2"
            )
        finally:
            os.kill(h1.pid, signal.SIGCONT)
        assert not matching(records, T.CheckpointFallback, job="t")
        found = run_folders(tmp_path / "hosts" / "h2" / "runs", "t", resume.n)
        text = (found[-1] / "output.log").read_text()
        step = resume.event.ckpt_step
        assert f"xirang sdk: restored step {step} (the resume named step {step})" in text, text[-500:]
