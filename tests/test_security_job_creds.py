"""Each job run's own NATS credentials, against the shipped config on loopback (TLS,
decentralised JWT auth from `xirang nats init`/`add-user`): minted by its host with the
node's scoped job signing key, they reach that job's own checkpoints and metrics and
nothing else (not another job's checkpoints, facts or inbox, not the log), they are not
the host's, they expire, and a host cannot mint more than the job template allows."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time

import nats
import pytest

from tests.data_helpers import xirang
from tests.secure_nats import SecureNats, run_cli, running_cluster
from transport import bus
from transport import checkpoints as ckptstore
from transport.natsd import EmbeddedNats
from trust import natsjwt
from trust.connect import connect_options
from trust.natsauth import JobMinter, read_creds

pytestmark = pytest.mark.timeout(90)


class Session:
    """One connection that records what the server refused (it never reconnects)."""

    def __init__(self, nc, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors
        self.js = nc.jetstream(timeout=2)

    def refused(self, subject: str) -> bool:
        return any("permissions violation" in e and f'"{subject.lower()}"' in e for e in self.errors)


async def _session(nats_: SecureNats, creds: str) -> Session:
    errors: list[str] = []

    async def on_error(err):
        errors.append(str(err).lower())

    options, _ = connect_options(nats_.url, creds)
    nc = await nats.connect(
        **options, error_cb=on_error, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5
    )
    return Session(nc, errors)


async def _settle(session: Session) -> None:
    await session.nc.flush()
    await asyncio.sleep(0.2)  # the server's -ERR for a refused publish arrives after the flush


def _streams(nats_: SecureNats) -> None:
    async def go():
        nc, js = await bus.connect(nats_.url, creds=nats_.creds("scheduler"), reconnects=1)
        try:
            await bus.ensure_streams(js, replicas=1)
        finally:
            await nc.close()

    asyncio.run(go())


@pytest.fixture
def secure(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch) as (started, _procs):
        _streams(started)
        yield started


def test_a_jobs_credentials_reach_its_own_checkpoints_only_and_are_not_the_hosts(secure, tmp_path):
    minter = JobMinter.from_creds(secure.creds("host-h1"), ttl_s=60)
    a = str(minter.write("train.a", tmp_path / "runs" / "a" / "nats.creds"))
    b = str(minter.write("train-b", tmp_path / "runs" / "b" / "nats.creds"))
    assert stat.S_IMODE(os.stat(a).st_mode) == 0o600
    host, job = read_creds(secure.creds("host-h1")), read_creds(a)
    # its own user (key and JWT), issued by the node's job key, not the host's user or the account
    assert job["seed"] != host["seed"] and job["claims"]["sub"] != host["claims"]["sub"]
    assert job["claims"]["iss"] == natsjwt.public_key(host["job_key"]) != host["claims"]["iss"]
    assert job["job_key"] is None and 0 < job["claims"]["exp"] - time.time() <= 60

    async def go():
        mine, other = await _session(secure, a), await _session(secure, b)
        try:
            await ckptstore.put(mine.js, "train.a", "h1", 0, b"weights of a" * 1000)
            assert await ckptstore.get(mine.js, "train.a", 0) == b"weights of a" * 1000
            # the other job cannot read it ...
            with pytest.raises(asyncio.TimeoutError):  # the request is refused: no reply comes
                await ckptstore.get(other.js, "train.a", 0)
            newest = ckptstore.subject("train.a", ckptstore.ANY_NODE, 0, "meta")
            assert other.refused(f"$JS.API.DIRECT.GET.XR_CKPT.{newest}"), other.errors
            own = ckptstore.subject("train.a", "h1", 0, "meta")
            # ... nor overwrite it, nor speak for it or its host, nor listen on its inbox
            for subject in (
                ckptstore.subject("train.a", "h1", 0, 0),
                f"xr.job.{own.split('.')[2]}.metrics",
                "xr.in.host.h1.checkpoint_saved",
                "xr.in.client.vision.li.submit",
                "xr.ev.log.JobStarted",
                "$JS.API.STREAM.PURGE.XR_CKPT",
                "$JS.API.STREAM.MSG.DELETE.XR_CKPT",
            ):
                await other.nc.publish(subject, b"{}")
                await _settle(other)
                assert other.refused(subject), subject
            for subject in (f"_INBOX.job-{own.split('.')[2]}.>", "_INBOX.>", ">", "xr.hb.*"):
                await other.nc.subscribe(subject)
                await _settle(other)
                assert other.refused(subject), subject
            assert await ckptstore.get(mine.js, "train.a", 0) == b"weights of a" * 1000
            # its own checkpoints work as well, but only under its node's subjects
            await ckptstore.put(other.js, "train-b", "h1", 0, b"b")
            assert await ckptstore.get(other.js, "train-b", 0) == b"b"
            elsewhere = ckptstore.subject("train-b", "h2", 0, "meta")
            await other.nc.publish(elsewhere, b"{}")
            await _settle(other)
            assert other.refused(elsewhere)
        finally:
            await mine.nc.close()
            await other.nc.close()

    asyncio.run(go())


def test_a_jobs_credentials_expire_and_a_host_cannot_mint_beyond_the_job_template(secure, tmp_path):
    host = read_creds(secure.creds("host-h1"))

    async def refused(creds: str) -> bool:
        try:
            session = await _session(secure, creds)
        except Exception as err:  # noqa: BLE001 - what we want: the server says no
            return "authorization violation" in str(err).lower()
        await session.nc.close()
        return False

    def forged(claims: dict, signer: str) -> str:
        seed = natsjwt.new_seed("user")
        claims = {**claims, "sub": natsjwt.public_key(seed)}
        path = tmp_path / f"forged-{len(list(tmp_path.glob('forged-*')))}.creds"
        return str(natsjwt.write_private(path, natsjwt.creds_text(natsjwt.encode(claims, signer), seed)))

    async def go():
        # expired credentials are refused at connect
        expired = JobMinter(host["job_key"], host["account"], ttl_s=-5)
        assert await refused(str(expired.write("train", tmp_path / "expired.creds")))
        # a connection is closed when its credentials expire
        short = JobMinter(host["job_key"], host["account"], ttl_s=2)
        path = short.write("train", tmp_path / "short.creds")
        expires_s = read_creds(path)["claims"]["exp"]
        session = await _session(secure, str(path))
        deadline = time.monotonic() + 10
        while not session.nc.is_closed and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert session.nc.is_closed and time.time() >= expires_s - 0.2, session.errors
        # the job key signs job users only: a user with its own permissions is refused ...
        grab_all = natsjwt.user_claims("job-x", "", host["account"], ["job:x"])
        grab_all["nats"]["pub"] = {"allow": [">"]}
        assert await refused(forged(grab_all, host["job_key"]))
        # ... and neither the host's own key nor an unknown key can sign a user
        plain = natsjwt.user_claims("job-x", "", host["account"], ["job:x"])
        assert await refused(forged(plain, host["seed"]))
        assert await refused(forged(plain, natsjwt.new_seed("account")))
        # a fresh, well-formed job user works
        assert not await refused(forged(plain, host["job_key"]))

    asyncio.run(go())
    # and the CLI says so in one line, not "no server"
    expired = str(JobMinter(host["job_key"], host["account"], ttl_s=-5).write("x", tmp_path / "x.creds"))
    code, out = run_cli({**secure.env("op-alice"), "XIRANG_CREDS": expired}, "jobs", "--nats", secure.url)
    assert code != 0 and "refused the credentials" in out and "Traceback" not in out, out


def test_notices_node_claims_new_hosts_and_revocations_follow_the_shipped_permissions(secure, tmp_path):
    async def go():
        li = await _session(secure, secure.creds("client-vision-li"))
        kim = await _session(secure, secure.creds("client-safety-kim"))
        alice = await _session(secure, secure.creds("op-alice"))
        h1 = await _session(secure, secure.creds("host-h1"))
        second = await _session(secure, secure.creds("host-h1"))
        try:
            # a user reads only their own notices; operators publish them
            got = await li.nc.subscribe("xr.notice.li")
            await li.nc.subscribe("xr.notice.kim")
            await _settle(li)
            assert li.refused("xr.notice.kim") and not li.refused("xr.notice.li")
            await alice.nc.publish("xr.notice.li", b"{}")
            await _settle(alice)
            assert (await got.next_msg(timeout=2)).data == b"{}"
            await kim.nc.publish("xr.notice.li", b"forged")
            await _settle(kim)
            assert kim.refused("xr.notice.li")

            # the agent of a node answers claims for its node (a second agent learns it is
            # not alone); it may not answer or ask for another node
            async def answer(msg):
                await msg.respond(b"taken")

            await h1.nc.subscribe("xr.agent.claim.h1", cb=answer)
            await _settle(h1)
            assert (await second.nc.request("xr.agent.claim.h1", b"", timeout=2)).data == b"taken"
            await h1.nc.subscribe("xr.agent.claim.h2")
            await _settle(h1)
            assert h1.refused("xr.agent.claim.h2")
        finally:
            for session in (li, kim, alice, h1, second):
                await session.nc.close()

    asyncio.run(go())

    # a host added later: its jobs' credentials work once the servers reload accounts.conf
    assert xirang("nats", "add-user", "host", "h2", "--dir", str(secure.conf_dir)).returncode == 0
    job = str(JobMinter.from_creds(secure.creds("host-h2")).write("j2", tmp_path / "j2.creds"))

    async def connects(creds: str) -> bool:
        try:
            await (await _session(secure, creds)).nc.close()
            return True
        except Exception:  # noqa: BLE001 - refused
            return False

    assert asyncio.run(connects(secure.creds("host-h2"))) and not asyncio.run(connects(job))
    os.kill(secure.procs[0].pid, signal.SIGHUP)  # nats-server --signal reload
    deadline = time.monotonic() + 10
    while not asyncio.run(connects(job)):
        assert time.monotonic() < deadline, "the reloaded server still refuses h2's jobs"
        time.sleep(0.2)

    # a job resumed on the new host reads what it saved on h1, and writes under h2 only
    on_h1 = str(JobMinter.from_creds(secure.creds("host-h1")).write("jx", tmp_path / "jx-h1.creds"))
    on_h2 = str(JobMinter.from_creds(secure.creds("host-h2")).write("jx", tmp_path / "jx-h2.creds"))

    async def move():
        first, second = await _session(secure, on_h1), await _session(secure, on_h2)
        try:
            await ckptstore.put(first.js, "jx", "h1", 1, b"saved on h1")
            assert await ckptstore.get(second.js, "jx", 1) == b"saved on h1"
            await ckptstore.put(second.js, "jx", "h2", 2, b"saved on h2")
            assert await ckptstore.get_located(first.js, "jx", 2) == ("h2", b"saved on h2")
        finally:
            await first.nc.close()
            await second.nc.close()

    asyncio.run(move())

    # revoking a client and a host: after a reload their credentials, and the host's jobs',
    # are refused; the others' still work
    for user in ("client-safety-kim", "host-h2"):
        assert xirang("nats", "revoke", user, "--dir", str(secure.conf_dir)).returncode == 0
    os.kill(secure.procs[0].pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while asyncio.run(connects(secure.creds("client-safety-kim"))):
        assert time.monotonic() < deadline, "the reloaded server still takes a revoked user"
        time.sleep(0.2)
    assert not asyncio.run(connects(secure.creds("host-h2"))) and not asyncio.run(connects(on_h2))
    assert asyncio.run(connects(secure.creds("client-vision-li"))) and asyncio.run(connects(on_h1))


def test_a_connection_without_credentials_does_not_send_as_an_earlier_ones_identity(tmp_path, monkeypatch):
    # As an earlier connection of this process with an operator's credentials left it.
    monkeypatch.setitem(bus._IDENTITY, "from_creds", "op:admin")
    monkeypatch.delenv("XIRANG_CREDS", raising=False)
    monkeypatch.delenv(bus.IDENTITY_ENV, raising=False)

    async def connect_and_close(url: str) -> None:
        nc, _ = await bus.connect(url)
        await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(connect_and_close(server.url))
    assert bus.default_sender() == ""
