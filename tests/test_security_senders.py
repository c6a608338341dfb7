"""Nobody acts as someone else on the shipped NATS configuration: a subject with a token more
(or fewer) than the sender's name is refused by the server for every role, so no input reaches
the scheduler without a sender the server established; the scheduler knows the bus
authenticates and would refuse one (`unknown_sender`, core/identity.py); and the honest
subject of the same user still works."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agents.scheduler import bus_authenticates
from core import types as T
from tests.secure_nats import run_cli, running_cluster, spawn_scheduler
from tests.test_live_deploy import _attack_log, _records, _run, wait_for_streams
from transport import bus

pytestmark = pytest.mark.timeout(150)

# (user whose credentials publish, subject, the input): each would act as someone else or
# beyond its role if the sender were inferred leniently.
ATTACKS = [
    (
        "client-vision-li",
        "xr.in.client.vision.li.x.submit",
        T.Submit(id="ghost-1", job="ghost", team="safety", user="kim", level=0, gpus=1),
    ),
    ("client-vision-li", "xr.in.client.vision.li.x.set_policy", T.SetPolicy(id="ghost-2", params={})),
    (
        "client-vision-li",
        "xr.in.client.vision.li.x.y.node_up",
        T.NodeUp(id="ghost-3", node="ghost-node", gpu_model="H100", gpus=256),
    ),
    (
        "client-vision-li",
        "xr.in.client.vision.submit",
        T.Submit(id="ghost-4", job="ghost4", team="vision", user="li", level=0, gpus=1),
    ),  # fmt: skip
    ("host-h1", "xr.in.host.h1.x.finished", T.Finished(id="ghost-5", job="victim", ok=False)),
    (
        "host-h1",
        "xr.in.host.h1.x.node_up",
        T.NodeUp(id="ghost-6", node="ghost-node", gpu_model="H100", gpus=256),
    ),
    ("op-alice", "xr.in.op.alice.x.set_policy", T.SetPolicy(id="ghost-7", params={})),
    (
        "client-vision-li",
        "xr.in.submit",
        T.Submit(id="ghost-8", job="ghost8", team="vision", user="li", level=0, gpus=1),
    ),  # fmt: skip
]


@pytest.fixture
def secure(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch) as started:
        yield started


def _publish_refused(nats, user: str, subject: str, inp: T.Input) -> bool:
    """Whether the server refused `user` publishing `inp` on `subject` (no ack came back)."""

    async def go(nc, js):
        assert bus_authenticates(nc)
        try:
            await js.publish(subject, T.encode(inp), headers={"Nats-Msg-Id": inp.id}, timeout=2)
        except Exception:  # noqa: BLE001 - refused: the permission error leaves the request unanswered
            return True
        return False

    return _run(nats, user, go)


def _in_subjects(nats) -> dict[str, int]:
    async def go(nc, js):
        info = await js.stream_info(bus.IN_STREAM, subjects_filter=">")
        return dict(info.state.subjects or {})

    return _run(nats, "op-alice", go)


def test_no_role_may_publish_an_input_on_a_subject_with_a_token_more_or_fewer(secure, tmp_path):
    nats, procs = secure
    procs.append(spawn_scheduler(nats, tmp_path))
    wait_for_streams(nats)
    refused = [subject for user, subject, inp in ATTACKS if _publish_refused(nats, user, subject, inp)]
    assert refused == [subject for _, subject, _ in ATTACKS]

    # the same user on its own subject is heard, and is who it says it is
    code, answer = run_cli(
        nats.env("client-vision-li"),
        "submit", "mine", "--team", "vision", "--user", "li", "--level", "6", "--gpus", "1",
        "--nats", nats.url, "--json",
    )  # fmt: skip
    assert code == 0 and answer["outcome"] == "accepted", answer
    subjects = _in_subjects(nats)
    assert "xr.in.client.vision.li.submit" in subjects, subjects
    assert not set(subjects) & {subject for _, subject, _ in ATTACKS}, subjects
    records = _records(nats)
    submitted = [r.event for r in records if isinstance(r.event, T.JobSubmitted)]
    assert [(e.job, e.team, e.user) for e in submitted] == [("mine", "vision", "li")]
    # (the log's first record, the policy it starts under, is the scheduler's own)
    assert not any(isinstance(r.event, (T.PolicyChanged, T.NodeJoined)) for r in records if r.n > 1)
    accepted = [r.event.input for r in records if isinstance(r.event, T.InputAccepted)]
    assert [i.origin for i in accepted if isinstance(i, T.Submit)] == ["client:vision:li"]


def _wait_for_submitted(nats, job: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(isinstance(r.event, T.JobSubmitted) and r.event.job == job for r in _records(nats)):
        assert time.monotonic() < deadline, f"{job} never submitted"
        time.sleep(0.2)


def test_a_reader_audits_the_log_and_can_send_nothing(secure, tmp_path):
    nats, procs = secure
    procs.append(spawn_scheduler(nats, tmp_path))
    wait_for_streams(nats)
    code, answer = run_cli(
        nats.env("client-vision-li"),
        "submit", "mine", "--team", "vision", "--user", "li", "--level", "6", "--gpus", "1",
        "--nats", nats.url, "--json",
    )  # fmt: skip
    assert code == 0 and answer["outcome"] == "accepted", answer
    _wait_for_submitted(nats, "mine")

    async def read_all(nc, js):
        return [r for _, r in await bus.all_records(js)]

    read = _run(nats, "reader-auditor", read_all, timeout_s=10)
    assert any(isinstance(r.event, T.JobSubmitted) and r.event.job == "mine" for r in read)
    public_key = str(tmp_path / "sched" / "keys" / "scheduler.pub")
    code, audit = run_cli(
        nats.env("reader-auditor"), "audit", "--nats", nats.url, "--public-key", public_key, "--json"
    )
    assert code == 0 and audit["ok"] and audit["records_verified"] >= len(read), audit
    assert "verified" in audit["signatures"], audit

    inputs = [
        (
            "xr.in.reader.auditor.submit",
            T.Submit(id="r-1", job="r1", team="vision", user="li", level=0, gpus=1),
        ),
        ("xr.in.op.auditor.set_policy", T.SetPolicy(id="r-2", params={})),
        ("xr.in.client.vision.li.cancel", T.Cancel(id="r-3", job="mine")),
    ]
    assert all(_publish_refused(nats, "reader-auditor", subject, inp) for subject, inp in inputs)
    assert _run(nats, "reader-auditor", _attack_log) == []
    assert not set(_in_subjects(nats)) & {subject for subject, _ in inputs}


def test_an_open_embedded_bus_is_not_taken_for_an_authenticated_one(tmp_path):
    from transport.natsd import EmbeddedNats

    async def go(url):
        nc, _ = await bus.connect(url, reconnects=1)
        try:
            return bus_authenticates(nc)
        finally:
            await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        assert asyncio.run(go(server.url)) is False


def _account_claims(accounts_conf: str, authority) -> str:
    """The xirang account's JWT claims in an accounts.conf, as text."""
    from trust import natsjwt

    account = authority.public("account")
    token = next(
        line.split(": ", 1)[1] for line in accounts_conf.splitlines() if line.strip().startswith(account)
    )
    return json.dumps(natsjwt.decode(token.strip(), verify=False))


def test_a_role_newer_than_the_operators_folder_enters_its_account_when_first_added(tmp_path):
    from trust.natsauth import Authority, add_user

    folder = tmp_path / "nats"
    authority = Authority(folder)
    authority.init()
    # A folder made before the reader role existed: no key for it, none in accounts.conf.
    (folder / "keys" / "role-reader.nk").unlink()
    authority.write_accounts()
    (folder / "keys" / "role-reader.nk").unlink()
    before = (folder / "accounts.conf").read_text()
    entry, _ = add_user(folder, "reader", ["auditor"])
    after = (folder / "accounts.conf").read_text()
    reader_key = authority.public("role-reader")
    assert entry["account_changed"]
    assert reader_key not in _account_claims(before, authority) and reader_key in _account_claims(
        after, authority
    )
    entry, _ = add_user(folder, "reader", ["second"])
    assert not entry["account_changed"] and (folder / "accounts.conf").read_text() == after


def test_a_host_cordons_only_itself_and_only_an_operator_cordons_a_node(secure, tmp_path):
    """On the shipped config: a host's health report naming another node, and a `cordon` from
    a host or a client, each reach the scheduler on the sender's own subject and are refused
    with the reason; an operator's `xirang node cordon` is recorded as that operator's."""
    nats, procs = secure
    procs.append(spawn_scheduler(nats, tmp_path))
    wait_for_streams(nats)

    def send_as(user: str, sender: str, inp: T.Input) -> None:
        async def go(nc, js):
            await bus.send_input(js, inp, sender=sender)

        _run(nats, user, go, timeout_s=5)

    send_as("host-h1", "host:h1", T.NodeUp(id="up-h1", node="h1", gpu_model="H100", gpus=8))
    send_as("host-h1", "host:h1", T.NodeHealth(id="h-1", node="h2", healthy=False, reason="full"))
    send_as("host-h1", "host:h1", T.CordonNode(id="h-2", node="h1", reason="mine"))
    send_as("client-vision-li", "client:vision:li", T.CordonNode(id="c-1", node="h1", reason="theirs"))
    code, answer = run_cli(
        nats.env("op-alice"), "node", "cordon", "h1", "--reason", "PSU swap", "--nats", nats.url, "--json"
    )
    assert code == 0 and answer["outcome"] == "accepted", answer
    records = _records(nats)
    refused = {r.event.input_type: r.event.reason for r in records if isinstance(r.event, T.InputRejected)}
    assert refused == {"node_health": "identity_mismatch", "cordon": "not_permitted_for_role"}, refused
    assert sum(isinstance(r.event, T.InputRejected) for r in records) == 3
    cordons = [
        (r.event.node, r.event.by, r.event.reason) for r in records if isinstance(r.event, T.NodeCordoned)
    ]
    assert cordons == [("h1", "op:alice", "PSU swap")]
