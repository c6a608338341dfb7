"""Any framework's preemption contract on the live system: a job without the SDK asks for
SIGUSR1 at a notice (`--preempt-signal`), writes its own checkpoints to its checkpoint
folder and reports them with `xirang job checkpoint-saved --path`; it is priced from them
and resumed from them (`XR_RESUME_PATH`), from its host's second copy when the newest no
longer matches its digest, and the run's output says so."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from agents.local_cluster import Cluster, matching, sleep_command
from agents.runfolders import run_folders
from core import types as T

pytestmark = pytest.mark.timeout(180)

JOB = """\
import os, pathlib, signal, subprocess, sys, time
ckdir = pathlib.Path(os.environ["XR_CKPT_DIR"])
resume = os.environ.get("XR_RESUME_PATH", "")
step = int(pathlib.Path(resume).read_text().split()[0]) if resume else 0
print("resumed from", resume or "scratch", "at step", step, flush=True)
notice = []
signal.signal(signal.SIGUSR1, lambda *a: notice.append(1))

def save(step):
    path = ckdir / f"step-{step}"
    path.write_text(f"{step} weights")
    subprocess.run(["xirang", "job", "checkpoint-saved", "--step", str(step), "--path", str(path)], check=True)

last = time.monotonic()
while step < 100000:
    time.sleep(0.02)
    step += 1
    if notice:
        save(step)
        print("saved at the notice, step", step, flush=True)
        sys.exit(0)
    if time.monotonic() - last > 1.0:
        save(step)
        last = time.monotonic()
"""


def urgent(job: str) -> T.Submit:
    return T.Submit(
        job=job,
        team="ops",
        user="kim",
        level=0,
        gpus=8,
        gpu_models=["H100"],
        est_runtime_s=5,
        command=sleep_command(4),
    )


def output_of(cluster: Cluster, n: int) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = run_folders(cluster.root / "hosts" / "h1" / "runs", "v", n)
        if (
            found
            and (found[-1] / "output.log").exists()
            and "resumed from" in (found[-1] / "output.log").read_text()
        ):
            return (found[-1] / "output.log").read_text()
        time.sleep(0.1)
    raise AssertionError(f"no output from run {n}")


def test_a_job_reporting_its_own_checkpoints_is_priced_and_resumed_from_them_and_from_the_second_copy_when_one_is_corrupt(
    tmp_path,
):
    with Cluster(tmp_path) as cluster:
        cluster.scheduler()
        cluster.agent("h1", "8xH100", grace_s=2)
        cluster.wait_for(T.NodeJoined, node="h1")
        cluster.send(
            T.Submit(
                job="v",
                team="research",
                user="ana",
                level=6,
                gpus=8,
                gpu_models=["H100"],
                est_runtime_s=600,
                ckpt_interval_s=1,
                ckpt_cost_s=1,
                restore_cost_s=1,
                preempt_signal="USR1",
                grace_s=30,
                command=[sys.executable, "-c", JOB],
            )
        )
        cluster.wait_for(T.CheckpointRecorded, job="v", count=2, timeout_s=30)
        cluster.send(urgent("u1"))
        records = cluster.wait_for(T.VictimReleased, job="v")
        # Priced from what it reported: it loses only the progress since its newest checkpoint
        # (saved at the notice), not the whole time it ran.
        released = matching(records, T.VictimReleased, job="v")[0].event
        ran_ms = released.t - matching(records, T.JobRunning, job="v")[0].event.t
        newest = matching(records, T.CheckpointRecorded, job="v")[-1].event
        assert abs(released.lost_progress_ms - (released.t - newest.t)) <= 50
        assert released.lost_progress_ms < ran_ms / 2
        assert newest.path.startswith(str(tmp_path / "ckpt")) and newest.path.endswith(f"step-{newest.step}")
        records = cluster.wait_for(T.JobResumeRequested, job="v")
        resume = matching(records, T.JobResumeRequested, job="v")[-1]
        assert resume.event.resume_points[0].path == newest.path
        assert f"resumed from {newest.path} at step {newest.step}" in output_of(cluster, resume.n)

        # Again, and the newest checkpoint is spoilt before the resume.
        count = len(matching(records, T.CheckpointRecorded, job="v"))
        cluster.wait_for(T.CheckpointRecorded, job="v", count=count + 1, timeout_s=30)
        cluster.send(urgent("u2"))
        records = cluster.wait_for(T.VictimReleased, job="v", count=2)
        saved = [r.event for r in matching(records, T.CheckpointRecorded, job="v")]
        spoilt, previous = saved[-1], saved[-2]
        Path(spoilt.path).write_text("garbage")
        # Its host kept a second copy (tests/test_live_path_copies.py): the same step, from it.
        records = cluster.wait_for(T.JobRunning, job="v", count=3, timeout_s=30)
        assert not matching(records, T.CheckpointFallback, job="v")
        resume = matching(records, T.JobResumeRequested, job="v")[-1]
        text = output_of(cluster, resume.n)
        assert f"checkpoint of step {spoilt.step} at {spoilt.path}: its content no longer matches" in text
        assert f"resuming from step {spoilt.step} at " in text and f"at step {spoilt.step}" in text
        assert previous.step < spoilt.step
        cluster.wait_for(T.JobRunning, job="v", count=3)
        cluster.send(T.Cancel(job="v"))
        cluster.wait_for(T.JobCancelled, job="v")


def test_a_checkpoint_path_outside_the_jobs_folder_is_refused_and_nothing_is_reported(tmp_path):
    import subprocess

    outbox, mine = tmp_path / "outbox", tmp_path / "ckpt" / "j"
    mine.mkdir(parents=True)
    (tmp_path / "other.pt").write_text("someone else's")
    env = dict(
        os.environ,
        XR_OUTBOX=str(outbox),
        XR_RUN="h1/j/7",
        XR_JOB="j",
        XR_CKPT_ROOTS=str(mine),
        NODE_RANK="0",
    )
    cmd = [sys.executable, "-m", "xirang.cli", "job", "checkpoint-saved", "--step", "3", "--path"]
    refused = subprocess.run([*cmd, str(tmp_path / "other.pt")], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "outside the job's checkpoint folders" in refused.stderr
    (mine / "link").symlink_to(tmp_path / "other.pt")  # a link out of the folder is judged by its target
    refused = subprocess.run([*cmd, str(mine / "link")], env=env, capture_output=True, text=True)
    assert refused.returncode != 0
    assert not list(outbox.glob("*.fact")) if outbox.exists() else True
    (mine / "ok.pt").write_text("mine")
    taken = subprocess.run([*cmd, str(mine / "ok.pt")], env=env, capture_output=True, text=True)
    assert taken.returncode == 0, taken.stderr
    assert len(list(outbox.glob("*.fact"))) == 1
