"""Orderly stop: Ctrl-C on `xirang up` (SIGINT to it, SIGTERM from it to its agents)
checkpoints the running SDK jobs and requeues them; started again, they resume from those
checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.local_cluster import REPO, matching, train_command
from live_helpers import metrics, run_folder
from core import types as T
from transport import bus

pytestmark = pytest.mark.timeout(150)


def train(job: str) -> T.Submit:
    # No periodic checkpoint: the only one is the one the stop asks for.
    return T.Submit(
        job=job,
        team="ml",
        user="ana",
        level=3,
        gpus=2,
        gpu_models=["H100"],
        est_runtime_s=60,
        command=train_command(800, step_ms=10),
    )


def wait_steps(path: Path, steps: int, timeout_s: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = metrics(path) if path.exists() else []
        if lines and lines[-1]["step"] >= steps:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"no step {steps} in {path}")


def up(data: Path) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xirang.cli",
            "up",
            "--json",
            "--data-dir",
            str(data),
            "--hosts",
            "1",
            "--simulate",
            "8xH100",
            "--tick-ms",
            "200",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    return proc, json.loads(proc.stdout.readline())


def send(url: str, *inputs: T.Input) -> None:
    import asyncio

    async def go():
        nc, js = await bus.connect(url, reconnects=3)
        try:
            for inp in inputs:
                await bus.send_input(js, inp)
        finally:
            await nc.close()

    asyncio.run(go())


def log_records(url: str) -> list[T.Record]:
    import asyncio

    async def go():
        nc, js = await bus.connect(url, reconnects=3)
        try:
            return [r for _, r in await bus.all_records(js)]
        finally:
            await nc.close()

    return asyncio.run(go())


def wait_records(url: str, predicate, timeout_s: float = 30.0) -> list[T.Record]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            records = log_records(url)
        except Exception:  # noqa: BLE001 - the streams are not created yet
            records = []
        if records and predicate(records):
            return records
        time.sleep(0.3)
    raise AssertionError("condition not reached")


def test_ctrl_c_on_xirang_up_requeues_sdk_jobs_from_checkpoints_and_up_again_resumes_them(tmp_path):
    data = tmp_path / "xr"
    proc, info = up(data)
    try:
        wait_records(info["nats"], lambda rs: matching(rs, T.NodeJoined))
        send(info["nats"], train("t2"))
        records = wait_records(info["nats"], lambda rs: matching(rs, T.JobRunning, job="t2"))
        start = matching(records, T.JobStartRequested, job="t2")[0]
        wait_steps(run_folder(data / "hosts" / "host-1" / "runs", "t2", start.n) / "output.log", 100)
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(60)
    proc, info = up(data)
    try:
        records = wait_records(info["nats"], lambda rs: matching(rs, T.JobFinished, job="t2"), timeout_s=60)
        saved = matching(records, T.CheckpointRecorded, job="t2")[0].event
        resume = matching(records, T.JobResumeRequested, job="t2")[0].event
        assert saved.step >= 100 and resume.ckpt_step == saved.step
        # The agent's orderly stop (SIGINT from Ctrl-C, then SIGTERM from `up`) told the scheduler.
        assert [r.event.reason for r in matching(records, T.NodeLost)] == ["agent_stopped"]
        requeued = matching(records, T.JobRequeued, job="t2")
        assert len(requeued) == 1 and requeued[0].n < matching(records, T.JobResumeRequested, job="t2")[0].n
        resumed = matching(records, T.JobResumeRequested, job="t2")[0].n
        lines = metrics(run_folder(data / "hosts" / "host-1" / "runs", "t2", resumed) / "output.log")
        assert lines[0]["step"] == saved.step and lines[0].get("resumed") == 1
        assert not matching(records, T.JobFailed)
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(60)
