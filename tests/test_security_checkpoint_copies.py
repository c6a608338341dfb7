"""The second copies of checkpoints under the shipped permissions (TLS, JWT auth from
`xirang nats init`/`add-user`): a job run's own credentials fetch its copies from the agent
of the host that holds them (the agent answers its requests, and only those), never another
job's; a real agent serves a resumed SDK job its copy when the bus's is spoiled; and the
agent never serves a job anything but plain files of its own folder."""

from __future__ import annotations

import asyncio
import time
import os

import pytest

from agents import ckptcopy, sdk
from agents.local_cluster import FAST_POLICY, REPO, matching
from core import types as T
from tests.secure_nats import run_cli, running_cluster, spawn, spawn_scheduler
from tests.test_live_deploy import _wait, wait_for_streams
from tests.test_security_job_creds import _session, _settle, _streams
from transport import bus
from transport import checkpoints as ckptstore
from trust.natsauth import JobMinter

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def secure(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch) as (started, _procs):
        _streams(started)
        yield started


async def _until_answered(nc, timeout_s: float = 15) -> None:
    """Until h1's agent answers this job at all (on a loaded machine a TLS connection may
    still be coming back from a reconnect when the test asks first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await ckptcopy.fetch(nc, "h1", "train.a", "none-such")
            return
        except ckptcopy.CopyUnreachable:
            assert time.monotonic() < deadline, "h1's agent never answered"
            await asyncio.sleep(0.2)


def test_a_job_fetches_its_own_copies_from_its_host_and_no_other_jobs(secure, tmp_path):
    copies = tmp_path / "copies"
    mine = ckptcopy.job_folder(copies, "train.a")
    mine.mkdir(parents=True)
    weights = os.urandom(ckptcopy.CHUNK_BYTES * 2 + 1000)  # three replies
    ckptcopy.write_verified(mine, "7-0", weights)
    minter = JobMinter.from_creds(secure.creds("host-h1"), ttl_s=60)
    a = str(minter.write("train.a", tmp_path / "runs" / "a" / "nats.creds"))
    b = str(minter.write("train-b", tmp_path / "runs" / "b" / "nats.creds"))

    async def go():
        host_nc, _ = await bus.connect(secure.url, creds=secure.creds("host-h1"), reconnects=1)
        job_a, job_b = await _session(secure, a), await _session(secure, b)
        try:
            await ckptcopy.serve(host_nc, "h1", copies)
            await host_nc.flush()
            await _until_answered(job_a.nc)
            assert await ckptcopy.fetch(job_a.nc, "h1", "train.a", "7-0") == weights
            assert await ckptcopy.fetch(job_a.nc, "h1", "train.a", "7-1") is None  # none such
            # another job cannot ask for it: the server refuses the request
            with pytest.raises(ckptcopy.CopyUnreachable):
                await ckptcopy.fetch(job_b.nc, "h1", "train.a", "7-0")
            await _settle(job_b)
            assert job_b.refused(ckptcopy.subject("h1", "train.a")), job_b.errors
        finally:
            await host_nc.close()
            await job_a.nc.close()
            await job_b.nc.close()

    asyncio.run(go())


def test_the_agent_serves_only_plain_files_of_the_jobs_own_folder(tmp_path):
    folder = ckptcopy.job_folder(tmp_path, "a")
    folder.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"the host's own")
    (folder / "1-0").symlink_to(secret)
    os.link(secret, folder / "1-1")
    ckptcopy.write_verified(folder, "1-2", b"mine")
    token = folder.name

    def ask(name: str) -> bytes:
        return ckptcopy.reply_for(tmp_path, token, f'{{"name": "{name}", "offset": 0}}'.encode())

    assert ask("1-2") == b'{"size": 4}\nmine'
    for name in ("1-0", "1-1", "../secret", ".hidden", "1-9"):
        head = ask(name).partition(b"\n")[0]
        assert b"error" in head and b"the host's own" not in ask(name), name


def test_on_the_shipped_config_a_resumed_job_reads_its_hosts_copy_through_the_real_agent(
    tmp_path, monkeypatch
):
    with running_cluster(tmp_path, monkeypatch) as (nats, procs):
        (tmp_path / "policy.toml").write_text(FAST_POLICY)
        procs.append(spawn_scheduler(nats, tmp_path, "--policy", str(tmp_path / "policy.toml")))
        wait_for_streams(nats)
        procs.append(
            spawn(tmp_path, nats.env("host-h1"), "agent", "--nats", nats.url, "--node", "h1",
                  "--simulate", "1xH100", "--data-dir", str(tmp_path / "host"), "--grace-s", "2",
                  "--public-key", str(tmp_path / "sched" / "keys" / "scheduler.pub"))
        )  # fmt: skip
        _wait(nats, lambda rs: matching(rs, T.NodeJoined, node="h1"), 30, "h1 joined")
        train = f"python {REPO}/examples/train_numpy.py --steps 100000 --step-ms 20 --checkpoint-every-s 0.5"
        submit = [
            "submit",
            "t1",
            "--team",
            "vision",
            "--user",
            "li",
            "--gpus",
            "1",
            "--nats",
            nats.url,
            "--json",
        ]
        code, answer = run_cli(nats.env("client-vision-li"), *submit, "--level", "6", "--command", train)
        assert code == 0 and answer["outcome"] == "accepted", answer
        _wait(nats, lambda rs: len(matching(rs, T.CheckpointRecorded, job="t1")) >= 2, 60, "t1 saved twice")
        # An urgent job holds the node while the bus's copy of t1's newest checkpoint is spoiled.
        urgent = ["submit", "u1", "--team", "safety", "--user", "kim", "--gpus", "1", "--nats", nats.url]
        code, answer = run_cli(
            nats.env("client-safety-kim"), *urgent, "--json", "--level", "0", "--command", "sleep 8"
        )
        assert code == 0 and answer["outcome"] == "accepted", answer
        records = _wait(nats, lambda rs: matching(rs, T.PreemptionCommitted), 60, "t1 preempted")
        newest = matching(records, T.CheckpointRecorded, job="t1")[-1].event
        node, _, slot = newest.path[len("xr-ckpt:") :].rpartition("/")
        minter = JobMinter.from_creds(nats.creds("host-h1"), ttl_s=60)
        creds = str(minter.write("t1", tmp_path / "spoiler.creds"))

        async def spoil():
            nc, js = await bus.connect(nats.url, creds=creds, reconnects=1)
            try:
                data = bytearray(await ckptstore.get(js, "t1", slot, node))
                data[len(data) // 2] ^= 0xFF
                await ckptstore.put(js, "t1", node, slot, bytes(data))
            finally:
                await nc.close()

        asyncio.run(spoil())
        records = _wait(nats, lambda rs: len(matching(rs, T.JobRunning, job="t1")) >= 2, 60, "t1 resumed")
        resume = matching(records, T.JobResumeRequested, job="t1")[0].event
        assert resume.ckpt_digest == newest.digest and resume.ckpt_copies == 2
        assert not matching(records, T.CheckpointFallback, job="t1")
        assert matching(records, T.JobRunning, job="t1")[-1].event.restored_copy == 2
        copy = ckptcopy.job_folder(tmp_path / "host" / "hosts" / "h1" / ckptcopy.COPIES_DIR, "t1") / slot
        assert sdk.digest_of(copy.read_bytes()) == newest.digest


def test_a_copy_of_a_checkpoint_a_job_wrote_is_fetched_with_its_own_credentials_and_no_other_jobs(
    secure, tmp_path
):
    from agents import ckptpath, pathcopy

    written = tmp_path / "ckpt" / "train.a" / "step-7"
    (written / "shards").mkdir(parents=True)
    (written / "model.bin").write_bytes(os.urandom(pathcopy.SERVE_CHUNK_BYTES + 1000))  # two replies
    (written / "shards" / "rank-1.bin").write_bytes(b"shard")
    digest, _ = ckptpath.digest_path(written)
    paths_root = tmp_path / "h1" / pathcopy.HOST_PATHS_DIR
    held = pathcopy.host_job_folder(tmp_path / "h1", "train.a")
    pathcopy.copy_verified(written.parent, "step-7", held, f"{pathcopy.digest_hex(digest)}/step-7", digest, 0)
    minter = JobMinter.from_creds(secure.creds("host-h1"), ttl_s=60)
    a = str(minter.write("train.a", tmp_path / "runs" / "a" / "nats.creds"))
    b = str(minter.write("train-b", tmp_path / "runs" / "b" / "nats.creds"))
    resumed_a, resumed_b = tmp_path / "h2" / "a", tmp_path / "h2" / "b"
    resumed_a.mkdir(parents=True)
    resumed_b.mkdir(parents=True)

    async def go():
        host_nc, _ = await bus.connect(secure.url, creds=secure.creds("host-h1"), reconnects=1)
        job_a, job_b = await _session(secure, a), await _session(secure, b)
        try:
            await ckptcopy.serve(host_nc, "h1", tmp_path / "h1" / ckptcopy.COPIES_DIR, paths_root)
            await host_nc.flush()
            await _until_answered(job_a.nc)
            subject = ckptcopy.subject("h1", "train.a")
            rel = await pathcopy.fetch(job_a.nc, subject, digest, resumed_a)
            assert ckptpath.digest_path(resumed_a / rel)[0] == digest
            # another job cannot ask for it: the server refuses the request
            with pytest.raises(pathcopy.CopyRefused, match="no agent answers"):
                await pathcopy.fetch(job_b.nc, subject, digest, resumed_b, timeout_s=2)
            await _settle(job_b)
            assert job_b.refused(subject), job_b.errors
            assert not (resumed_b / pathcopy.COPIES_SUBDIR / pathcopy.digest_hex(digest) / "step-7").exists()
        finally:
            await host_nc.close()
            await job_a.nc.close()
            await job_b.nc.close()

    asyncio.run(go())
