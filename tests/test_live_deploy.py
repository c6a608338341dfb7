"""The shipped NATS configuration works as written and holds against its own users: a
server started from deploy/nats/single.conf (TLS, decentralised JWT users from `xirang nats
init`/`add-user`) runs SDK jobs that checkpoint and restore with their own short-lived
credentials (renewed by the host while they run), and what a hostile host or job would try
fails: no host, client or job may touch the log stream, a client acts only as itself, and the log still
verifies."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from pathlib import Path

import pytest
from nats.js import api

from agents import ckptfile
from agents.local_cluster import FAST_POLICY, matching, train_command
from live_helpers import run_folder
from tests.test_live_preemption import wait_metrics
from transport import bus
from transport import checkpoints as ckptstore
from trust import natsjwt
from trust.natsauth import JobMinter, read_creds
from core import types as T
from tests.secure_nats import SecureNats, run_cli, running_cluster, spawn, spawn_scheduler

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def secure(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch) as started:
        yield started


def _run(nats: SecureNats, user: str, coro_fn, timeout_s: float = 2.0):
    async def go():
        creds = user if user.endswith(".creds") else nats.creds(user)
        nc, js = await bus.connect(nats.url, creds=creds, reconnects=1)
        try:
            return await coro_fn(nc, nc.jetstream(timeout=timeout_s))
        finally:
            await nc.close()

    return asyncio.run(go())


def _records(nats: SecureNats) -> list[T.Record]:
    async def go(nc, js):
        return [r for _, r in await bus.all_records(js)]

    return _run(nats, "op-alice", go, timeout_s=10)


def _wait(nats: SecureNats, predicate, timeout_s: float, what: str) -> list[T.Record]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = _records(nats)
        except Exception:  # noqa: BLE001 - the stream may not exist yet
            records = []
        if predicate(records):
            return records
        assert time.monotonic() < deadline, (
            f"{what} not reached; tail {[T.type_name(r.event) for r in records[-8:]]}"
        )
        time.sleep(0.3)


def wait_for_streams(nats: SecureNats, timeout_s: float = 60) -> None:
    """Until the scheduler has made the streams (nobody else may)."""

    async def info(nc, js):
        return await js.stream_info(bus.EV_STREAM)

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _run(nats, "op-alice", info)
            return
        except Exception:  # noqa: BLE001 - not there yet, or the cluster is still electing
            assert time.monotonic() < deadline, "the scheduler made no streams"
            time.sleep(0.3)


async def _attack_log(nc, js) -> list[str]:
    """Everything a user other than the scheduler might try on the log; what got through."""
    got_through = []
    await nc.publish("xr.ev.log.JobStartRequested", b"{}")
    await nc.flush()
    for name, attempt in (
        (
            "update",
            lambda: js.update_stream(
                api.StreamConfig(
                    name=bus.EV_STREAM,
                    subjects=["xr.ev.>"],
                    deny_delete=False,
                    deny_purge=False,
                    allow_atomic=True,
                )
            ),
        ),
        ("purge", lambda: js.purge_stream(bus.EV_STREAM)),
        ("delete", lambda: js.delete_stream(bus.EV_STREAM)),
    ):
        try:
            await attempt()
            got_through.append(name)
        except Exception:  # noqa: BLE001 - refused or unanswered: the attack failed
            pass
    return got_through


def test_shipped_config_runs_sdk_jobs_and_keeps_everyone_but_the_scheduler_off_the_log(secure, tmp_path):
    nats, procs = secure
    (tmp_path / "policy.toml").write_text(FAST_POLICY)
    procs.append(spawn_scheduler(nats, tmp_path, "--policy", str(tmp_path / "policy.toml")))
    wait_for_streams(nats)
    procs.append(
        spawn(
            tmp_path,
            nats.env("host-h1"),
            "agent",
            "--nats",
            nats.url,
            "--node",
            "h1",
            "--simulate",
            "2xH100",
            "--data-dir",
            str(tmp_path / "host"),
            "--grace-s",
            "2",
            "--public-key",
            str(tmp_path / "sched" / "keys" / "scheduler.pub"),
            "--job-creds-ttl-s",
            "6",
        )
    )
    _wait(nats, lambda rs: matching(rs, T.NodeJoined, node="h1"), 20, "h1 joined")
    # the node claim works under the host's permissions: a second agent for h1 is refused
    second = spawn(tmp_path, nats.env("host-h1"), "agent", "--nats", nats.url, "--node", "h1",
                   "--simulate", "2xH100", "--data-dir", str(tmp_path / "host2"))  # fmt: skip
    procs.append(second)
    assert second.wait(30) != 0
    assert "already running" in "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))

    # an SDK job of vision:li checkpoints under the job role's permissions ...
    train = shlex.join(train_command(100_000, ckpt_s=1.0))
    code, answer = run_cli(
        nats.env("client-vision-li"),
        "submit",
        "train",
        "--team",
        "vision",
        "--user",
        "li",
        "--level",
        "6",
        "--gpus",
        "2",
        "--gpu-model",
        "H100",
        "--ckpt-cost-s",
        "0.1",
        "--command",
        train,
        "--nats",
        nats.url,
        "--json",
    )
    assert code == 0 and answer["outcome"] == "accepted", answer
    _wait(nats, lambda rs: matching(rs, T.CheckpointRecorded, job="train"), 30, "a checkpoint")
    # the job got its own credentials (in its run folder, minted with h1's job key, short-lived)
    # and its own checkpoint key, none of the host's secrets
    run = json.loads((tmp_path / "host" / "hosts" / "h1" / "runs" / "train.json").read_text())
    environ = dict(
        item.split("=", 1) for item in open(f"/proc/{run['pid']}/environ").read().split("\0") if "=" in item
    )
    host = read_creds(nats.creds("host-h1"))
    job = read_creds(environ["XIRANG_CREDS"])
    assert environ["XIRANG_CREDS"] == str(Path(run["dir"]) / "nats.creds") and "XR_CKPT_KEY" in environ
    assert job["claims"]["iss"] == natsjwt.public_key(host["job_key"]) and job["seed"] != host["seed"]
    assert job["claims"]["exp"] - time.time() <= 6 and job["job_key"] is None
    assert "@" not in environ["XR_NATS_URL"] and "XIRANG_CKPT_SECRET_FILE" not in environ
    # ... and restores from it after an urgent job of safety:kim preempted it
    code, answer = run_cli(
        nats.env("client-safety-kim"),
        "submit",
        "fix",
        "--team",
        "safety",
        "--user",
        "kim",
        "--level",
        "1",
        "--gpus",
        "2",
        "--gpu-model",
        "H100",
        "--command",
        "sleep 1",
        "--nats",
        nats.url,
        "--json",
    )
    assert code == 0 and answer["outcome"] == "accepted", answer
    records = _wait(nats, lambda rs: len(matching(rs, T.JobRunning, job="train")) == 2, 60, "train resumed")
    resume = matching(records, T.JobResumeRequested, job="train")[0]
    assert resume.event.ckpt_step > 0 and resume.event.ckpt_digest in {
        r.event.digest for r in matching(records, T.CheckpointRecorded, job="train")
    }
    resumed_log = run_folder(tmp_path / "host" / "hosts" / "h1" / "runs", "train", resume.n) / "output.log"
    lines = wait_metrics(resumed_log)
    assert lines[0]["step"] == resume.event.ckpt_step and lines[0].get("resumed") == 1, lines[:2]
    # the resumed run outlives its first credentials (6 s) and still checkpoints: its host
    # renews them and the SDK reconnects with the renewed ones
    resumed_t = matching(records, T.JobRunning, job="train")[-1].event.t
    _wait(
        nats,
        lambda rs: any(
            r.event.t >= resumed_t + 7_000 for r in matching(rs, T.CheckpointRecorded, job="train")
        ),
        40,
        "a checkpoint after the first credentials expired",
    )
    # all along the scheduler heard h1: its heartbeat listener connects with the scheduler's
    # own credentials, whose role may read xr.hb.* (the node timeout is 10 s, this ran longer)
    assert not matching(_records(nats), T.NodeLost, node="h1")

    # another job's credentials cannot read train's checkpoints; train's can, and they are
    # sealed for train alone
    minter = JobMinter.from_creds(nats.creds("host-h1"), ttl_s=60)
    another = str(minter.write("another-job", tmp_path / "another.creds"))
    train_creds = str(minter.write("train", tmp_path / "train.creds"))

    # where the log recorded the job's checkpoints: `xr-ckpt:<node>/<its run's slot>`
    where = [
        r.event.path[len("xr-ckpt:") :].rpartition("/")
        for r in matching(_records(nats), T.CheckpointRecorded, job="train")
    ]

    async def read_checkpoints(nc, js):
        found = [await ckptstore.get(js, "train", slot, node) for node, _, slot in where]
        return [data for data in found if data is not None]

    with pytest.raises(Exception):  # noqa: B017 - refused by the server: the request gets no reply
        _run(nats, another, read_checkpoints)
    secret = bytes.fromhex((tmp_path / "host" / "keys" / "checkpoint.secret").read_text().strip())
    saved = [
        ckptfile.read_manifest(d, ckptfile.job_key(secret, "train"))
        for d in _run(nats, train_creds, read_checkpoints)
    ]
    # (the resumed run goes on saving, reusing slots: its newest is at or past the resume step)
    assert saved and max(payload["step"] for payload in saved) >= resume.event.ckpt_step
    with pytest.raises(ckptfile.CheckpointError):
        ckptfile.read_manifest(
            _run(nats, train_creds, read_checkpoints)[0], ckptfile.job_key(secret, "another-job")
        )

    # the attacks: nobody but the scheduler may write, reconfigure, purge or delete the log
    before = _records(nats)
    for user in ("host-h1", another, "client-vision-li", "op-alice"):
        assert _run(nats, user, _attack_log) == [], user

    async def stream_config(nc, js):
        return (await js.stream_info(bus.EV_STREAM)).config

    config = _run(nats, "op-alice", stream_config)
    assert config.deny_delete and config.deny_purge
    # a client cannot submit as another team, neither in the body ...
    code, answer = run_cli(
        nats.env("client-vision-li"),
        "submit",
        "evil",
        "--team",
        "safety",
        "--user",
        "kim",
        "--level",
        "0",
        "--gpus",
        "1",
        "--nats",
        nats.url,
        "--json",
    )
    assert answer["outcome"] == "rejected" and answer["reason"] == "identity_mismatch", answer

    # ... nor on another team's subject, nor send set_policy, nor cancel another's job
    async def impersonate(nc, js):
        for subject in ("xr.in.client.safety.kim.submit", "xr.in.op.alice.set_policy", "xr.in.submit"):
            try:
                await js.publish(
                    subject, T.encode(T.Submit(job="evil2", team="safety", user="kim", level=0, gpus=1))
                )
                return subject
            except Exception:  # noqa: BLE001 - refused: good
                pass
        await bus.send_input(
            js, T.SetPolicy(params={"victims_per_preemption_max": 1}), sender="client:vision:li"
        )
        await bus.send_input(js, T.Cancel(job="fix"), sender="client:vision:li")
        return ""

    assert _run(nats, "client-vision-li", impersonate) == ""
    records = _wait(
        nats,
        lambda rs: len(matching(rs, T.InputRejected)) >= len(matching(before, T.InputRejected)) + 2,
        15,
        "the rejections",
    )
    reasons = {
        r.event.input_type: r.event.reason
        for r in records[len(before) :]
        if isinstance(r.event, T.InputRejected)
    }
    assert reasons.get("set_policy") == "not_permitted_for_role", reasons
    assert not matching(records, T.JobSubmitted, job="evil") and not matching(
        records, T.JobSubmitted, job="evil2"
    )
    assert not matching(records, T.PolicyChanged, by="client")

    code, summary = run_cli(
        nats.env("op-alice"),
        "audit",
        "--nats",
        nats.url,
        "--public-key",
        str(tmp_path / "sched" / "keys" / "scheduler.pub"),
        "--json",
    )
    assert code == 0 and summary["ok"] and "verified" in summary["signatures"], summary
