"""The second copies of checkpoints under the shipped permissions (TLS, JWT auth from
`xirang nats init`/`add-user`): a job run's own credentials fetch its copies from the agent
of the host that holds them (the agent answers its requests, and only those), never another
job's; and the agent never serves a job anything but plain files of its own folder."""

from __future__ import annotations

import asyncio
import os

import pytest

from agents import ckptcopy
from tests.secure_nats import running_cluster
from tests.test_security_job_creds import _session, _settle, _streams
from transport import bus
from trust.natsauth import JobMinter

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def secure(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch) as (started, _procs):
        _streams(started)
        yield started


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
            assert await ckptcopy.fetch(job_a.nc, "h1", "train.a", "7-0") == weights
            assert await ckptcopy.fetch(job_a.nc, "h1", "train.a", "7-1") is None  # none such
            # another job cannot ask for it: the server refuses the request
            assert await ckptcopy.fetch(job_b.nc, "h1", "train.a", "7-0") is None
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
