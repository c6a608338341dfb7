"""A replicated bus: the shipped 3-node cluster configuration on loopback (ports rewritten),
streams with three replicas (XIRANG_REPLICAS=3). The node leading the log stream is
SIGKILLed in the middle of a preemption saga: nothing is lost, the saga ends, the
scheduler carries on, and the log verifies."""

from __future__ import annotations

import os
import shlex
import signal
import time

import pytest

from agents.local_cluster import FAST_POLICY, matching, sleep_command, train_command
from core import types as T
from tests.secure_nats import SecureNats, run_cli, running_cluster, spawn
from tests.test_live_deploy import _run, _wait, wait_for_streams
from transport import bus

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch, nodes=3, stop_wait_s=30) as started:
        yield started


def submit(nats: SecureNats, team: str, user: str, job: str, level: int, command: list[str]) -> None:
    code, answer = run_cli(
        nats.env(f"client-{team}-{user}"), "submit", job, "--team", team, "--user", user,
        "--level", str(level), "--gpus", "8", "--gpu-model", "H100", "--ckpt-cost-s", "0.1",
        "--command", shlex.join(command), "--nats", nats.url, "--json",
    )  # fmt: skip
    assert code == 0 and answer["outcome"] == "accepted", answer


def log_leader(nats: SecureNats) -> str:
    async def info(nc, js):
        return (await js.stream_info(bus.EV_STREAM)).cluster.leader

    return _run(nats, "op-alice", info, timeout_s=10)


def test_killing_the_log_streams_leader_mid_saga_loses_nothing(cluster, tmp_path):
    nats, procs = cluster
    (tmp_path / "policy.toml").write_text(FAST_POLICY)
    sched = spawn(
        tmp_path, nats.env("scheduler"), "scheduler", "--nats", nats.url, "--data-dir",
        str(tmp_path / "sched"), "--tick-ms", "200", "--policy", str(tmp_path / "policy.toml"),
    )  # fmt: skip
    procs.append(sched)
    wait_for_streams(nats)
    procs.append(spawn(
        tmp_path, nats.env("host-h1"), "agent", "--nats", nats.url, "--node", "h1", "--simulate",
        "8xH100", "--data-dir", str(tmp_path / "host"), "--grace-s", "2", "--public-key",
        str(tmp_path / "sched" / "keys" / "scheduler.pub"), "--job-creds-ttl-s", "30",
    ))  # fmt: skip
    _wait(nats, lambda rs: matching(rs, T.NodeJoined, node="h1"), 30, "h1 joined")
    # Slow steps: the victim is still on its way to a safe point when the leader dies.
    submit(nats, "vision", "li", "victim", 6, train_command(100_000, step_ms=300))
    _wait(nats, lambda rs: matching(rs, T.JobRunning, job="victim"), 30, "victim running")
    time.sleep(2.0)  # the SDK is loaded
    submit(nats, "safety", "kim", "urgent", 0, sleep_command(1))
    _wait(nats, lambda rs: matching(rs, T.PreemptionPlanned), 30, "saga planned")
    leader = log_leader(nats)
    index = int(leader.rsplit("-", 1)[1]) - 1
    os.kill(nats.procs[index].pid, signal.SIGKILL)
    nats.procs[index].wait(10)

    records = _wait(nats, lambda rs: matching(rs, T.JobFinished, job="urgent"), 90, "urgent done")
    assert matching(records, T.PreemptionCommitted) or matching(records, T.PreemptionRolledBack)
    records = _wait(nats, lambda rs: len(matching(rs, T.JobRunning, job="victim")) == 2, 60, "victim back")
    assert [r.n for r in records] == list(range(1, len(records) + 1))  # nothing lost or doubled
    assert log_leader(nats) != leader
    assert sched.poll() is None
    code, summary = run_cli(
        nats.env("op-alice"), "audit", "--nats", nats.url, "--public-key",
        str(tmp_path / "sched" / "keys" / "scheduler.pub"), "--json",
    )  # fmt: skip
    assert code == 0 and summary["ok"], summary
