"""The smaller findings of a red-team round, each run again against real processes: a
non-finite number on the command line is refused instead of becoming a default; a plain
URL against a TLS server says so at once instead of hanging; a scheduler asked to stop
during an outage stops at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agents.local_cluster import REPO, Cluster
from core import types as T
from data_helpers import xirang
from secure_nats import SecureNats

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "option", ["--est-runtime-s", "--ckpt-cost-s", "--ckpt-interval-s", "--restore-cost-s"]
)
@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "-1"])
def test_a_non_finite_duration_is_refused_not_silently_a_default(option, value):
    done = xirang("submit", "j", "--team", "a", "--level", "5", "--gpus", "1", option, value, "--dry-run")
    assert done.returncode == 2 and "finite number of seconds" in done.stderr, done.stderr


def test_a_plain_url_against_a_tls_server_says_so_at_once(tmp_path):
    server = SecureNats(tmp_path).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("XIRANG_TLS")}
        env["XIRANG_CREDS"] = server.creds("client-vision-li")
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "xirang.cli", "jobs", "--nats", f"nats://localhost:{server.ports[0]}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert time.monotonic() - started < 15
        assert done.returncode != 0 and f"use tls://localhost:{server.ports[0]}" in done.stderr, done.stderr
    finally:
        server.stop()


def test_a_scheduler_stopped_during_an_outage_stops_at_once(tmp_path):
    with Cluster(tmp_path) as c:
        sched = c.scheduler("s1")
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.nats.kill()
        time.sleep(2)
        started = time.monotonic()
        os.kill(sched.pid, signal.SIGTERM)
        sched.wait(30)
        assert time.monotonic() - started < 5, time.monotonic() - started
        assert sched.returncode == 0, (c.logs / "s1.log").read_text()[-3000:]
        c.nats.start()  # for the cluster's own orderly stop


def test_the_time_a_scheduler_was_down_is_not_counted_as_a_jobs_run_time(tmp_path):
    """A fact that waited in XR_IN while no scheduler led is dated when the bus received
    it: a job that ended during the downtime ran for its own time, not the downtime's (the
    finding: a victim's release during a scheduler's downtime recorded 11 s of lost progress
    for under 2 s)."""
    with Cluster(tmp_path) as c:
        first = c.scheduler("s1")
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.send(T.Submit(job="short", team="t", user="u", level=5, gpus=1, command=["sleep", "2"]))
        c.wait_for(T.JobRunning, job="short")
        c.kill(first)
        time.sleep(10)  # the job ends 2 s in; its `finished` waits for a scheduler
        c.scheduler("s2")
        finished = c.wait_for(T.JobFinished, job="short")[-1].event
        assert 1500 <= finished.run_ms < 5000, finished.run_ms


def test_an_agent_running_as_root_with_a_pinned_job_user_is_not_told_to_run_as_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the warning differs only for an agent running as root")
    with Cluster(tmp_path) as c:  # its agents get --job-user of whoever started it, as `xirang up`'s
        c.scheduler()
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        log = (c.logs / "h1.log").read_text()
        assert "run the agent as root" not in log and "as --job-user (or $XIRANG_JOB_USER) asks" in log, log


def test_the_signing_key_folder_and_the_checkpoint_secret_folder_are_private(tmp_path):
    from xirang.cmd_live import checkpoint_secret

    done = xirang("key", "create", "--dir", str(tmp_path / "keys"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    checkpoint_secret(None, str(tmp_path / "data"))
    assert (tmp_path / "data" / "keys").stat().st_mode & 0o777 == 0o700
    with Cluster(tmp_path / "c") as c:  # the scheduler makes its key on first use
        c.scheduler()
        c.wait(lambda rs: (tmp_path / "c" / "keys" / "scheduler.key").exists(), 20, "the key")
        assert (tmp_path / "c" / "keys").stat().st_mode & 0o777 == 0o700
