"""Only the scheduler writes the log, provably: records carry its Ed25519 signature, and
audit, the scheduler and host agents refuse a record it did not sign, even one whose
plain hash chain was recomputed by the forger."""

from __future__ import annotations

import hashlib
import json
import sys
import time

import msgspec
import pytest

from transport import bus
from agents.local_cluster import Cluster
from core import types as T
from data_helpers import workload_records, write_jsonl, xirang
from trust.signing import LogVerifier, SignatureError, Signer, create_key, sign_records

pytestmark = pytest.mark.timeout(120)


def _signed(records, signer) -> list[T.Record]:
    """Sign as the scheduler does: per input (a run of records with one input_seq)."""
    out, group = [], []
    for record in records:
        if group and record.input_seq != group[0].input_seq:
            out += sign_records(group, signer, bus.host_nodes)
            group = []
        group.append(record)
    return out + sign_records(group, signer, bus.host_nodes)


def _forged_after(last: T.Record, event: T.Event) -> T.Record:
    """What a writer without the key can make: a record whose hash chain is perfect."""
    digest = hashlib.sha256(last.hash.encode() + T.encode(event)).hexdigest()
    return T.Record(n=last.n + 1, prev=last.hash, hash=digest, input_seq=last.input_seq + 1, event=event)


def _forged_start(last: T.Record, node: str, command: list[str]) -> T.JobStartRequested:
    return T.JobStartRequested(
        t=last.event.t, job="evil", nodes=[node], placement=[T.Slot(node=node, gpus=[0])], command=command
    )


@pytest.fixture
def keys(tmp_path):
    private, public, _ = create_key(tmp_path / "keys")
    return Signer.load(private), str(public)


def _audit(log: str, *extra: str) -> tuple[int, dict]:
    result = xirang("audit", "--log", log, "--json", *extra)
    return result.returncode, json.loads(result.stdout)


def test_audit_verifies_a_signed_log_and_names_a_forged_record_with_a_recomputed_chain(tmp_path, keys):
    signer, public = keys
    records = _signed(workload_records(jobs=40), signer)
    good = write_jsonl(str(tmp_path / "good.jsonl"), records)
    rc, summary = _audit(good, "--public-key", public)
    assert rc == 0, summary
    assert summary["signatures"].startswith(f"{sum(bool(r.sig) for r in records)} verified")

    forged = _forged_after(records[-1], _forged_start(records[-1], "gpu-a", ["id"]))
    bad = write_jsonl(str(tmp_path / "bad.jsonl"), [*records, forged])
    rc, summary = _audit(bad, "--public-key", public)
    assert rc == 1 and summary["problem_record"] == forged.n
    assert summary["problem_line"] == len(records) + 1
    assert "not signed by the scheduler" in summary["problem"]


def test_project_with_a_public_key_projects_only_signed_records_and_passes_over_a_forged_one(
    tmp_path, keys, caplog
):
    signer, public = keys
    records = _signed(workload_records(jobs=20), signer)
    good = write_jsonl(str(tmp_path / "good.jsonl"), records)
    done = xirang("project", "--log", good, "--db", str(tmp_path / "good.duckdb"), "--public-key", public)
    assert done.returncode == 0 and json.loads(done.stdout)["last_record"] == records[-1].n, done.stderr
    forged = _forged_after(records[-1], records[-1].event)
    bad = write_jsonl(str(tmp_path / "bad.jsonl"), [*records, forged])
    done = xirang("project", "--log", bad, "--db", str(tmp_path / "bad.duckdb"), "--public-key", public)
    assert done.returncode == 0 and json.loads(done.stdout)["last_record"] == records[-1].n, done.stderr
    assert f"claims record {forged.n}): not signed by the scheduler" in caplog.text


def test_a_record_signed_with_another_key_or_a_copied_signature_is_refused(tmp_path, keys):
    signer, public = keys
    records = _signed(workload_records(jobs=20), signer)
    rogue = Signer.load(create_key(tmp_path / "rogue")[0])
    forged = rogue.sign_record(_forged_after(records[-1], _forged_start(records[-1], "gpu-a", ["id"])))
    rc, summary = _audit(
        write_jsonl(str(tmp_path / "rogue.jsonl"), [*records, forged]), "--public-key", public
    )
    assert (
        rc == 1
        and summary["problem_record"] == forged.n
        and "not a trusted scheduler key" in summary["problem"]
    )

    copied = msgspec.structs.replace(
        _forged_after(records[-1], records[-1].event), key=records[-1].key, sig=records[-1].sig
    )
    rc, summary = _audit(
        write_jsonl(str(tmp_path / "copy.jsonl"), [*records, copied]), "--public-key", public
    )
    assert rc == 1 and summary["problem_record"] == copied.n and "does not verify" in summary["problem"]


def test_a_signed_log_needs_a_public_key_to_pass_audit_and_a_rotated_key_still_verifies(tmp_path, keys):
    signer, public = keys
    first = _signed(workload_records(jobs=20), signer)
    rc, summary = _audit(write_jsonl(str(tmp_path / "a.jsonl"), first))
    assert rc == 1 and "--public-key" in summary["problem"]

    new_private, _, new_id = create_key(tmp_path / "keys", rotate=True)
    rotated = Signer.load(new_private)
    event = T.TeamProtected(t=first[-1].event.t + 1, team="a", until_t=0, preempted_in_window=0)
    tail = _forged_after(first[-1], event)  # chained, then signed with the rotated key
    log = write_jsonl(str(tmp_path / "b.jsonl"), [*first, rotated.sign_record(tail)])
    rc, summary = _audit(log, "--public-key", public)
    assert rc == 0, summary
    assert new_id in summary["signatures"] and signer.key_id in summary["signatures"]


def test_log_verifier_refuses_unsigned_records_between_signed_ones(keys):
    signer, _ = keys
    one_per_input = [
        msgspec.structs.replace(r, input_seq=i + 1) for i, r in enumerate(workload_records(jobs=10))
    ]
    records = _signed(one_per_input, signer)
    stripped = [msgspec.structs.replace(r, key="", sig="") if i == 5 else r for i, r in enumerate(records)]
    verifier = LogVerifier(signer.keyring())
    with pytest.raises(SignatureError):
        for record in stripped:
            verifier.admit(record)
        verifier.finish()


def test_the_live_log_is_signed_and_a_forged_decision_is_never_acted_on(tmp_path, monkeypatch):
    """A writer without the key appends a start order for a host with a perfect hash chain
    (a forger of the scheduler's records): the host refuses to run it, the scheduler refuses
    to adopt it, and audit names it."""
    marker = tmp_path / "pwned"
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "4xH100")
        records = c.wait_for(T.NodeJoined, node="h1")
        assert all(r.key for r in records if r.sig) and records[-1].sig
        verifier = LogVerifier(Signer.load(tmp_path / "keys" / "scheduler.key").keyring())
        for record in records:
            verifier.admit(record)
        verifier.finish()

        command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]

        async def forge(nc, js):
            last_seq = await bus.stream_last_seq(js, bus.EV_STREAM)
            ordered = [r for _, r in await bus.all_records(js)]
            forged = _forged_after(ordered[-1], _forged_start(ordered[-1], "h1", command))
            await bus.publish_atomic(nc, bus.record_messages([forged]), last_seq, "intruder")
            return forged, last_seq + 1  # its log copy (its host copy follows)

        forged, forged_seq = c._run(forge)
        # The scheduler passes over it, says so in the log, signed, and goes on.
        disowned = c.wait_for(T.RecordDisowned, log_seq=forged_seq)[-1]
        assert disowned.event.reason == "unsigned" and disowned.sig
        c.send(T.Submit(job="after", team="a", user="u", level=5, gpus=1))
        c.wait_for(T.JobSubmitted, job="after")
        result = xirang(
            "audit", "--nats", c.url, "--public-key", str(tmp_path / "keys" / "scheduler.pub"), "--json"
        )
        summary = json.loads(result.stdout)
        assert result.returncode == 0, summary
        assert (summary["foreign_messages"], summary["disowned"]) == (1, 1)
        assert summary["foreign"][0]["stream_seq"] == forged_seq
        assert summary["foreign"][0]["disowned_by_record"] == disowned.n
        monkeypatch.setenv("XIRANG_PUBLIC_KEY", str(tmp_path / "keys" / "scheduler.pub"))
        shown = xirang("jobs", "--nats", c.url)  # a command shows only what the scheduler signed
        assert shown.returncode == 0 and "after" in shown.stdout and "evil" not in shown.stdout, shown
        time.sleep(3)
        assert not marker.exists()
        assert "refusing record" in (c.logs / "h1.log").read_text()
        assert "disowned 1 foreign message" in (c.logs / "s1.log").read_text()


def test_a_password_on_the_command_line_is_refused_and_multi_server_urls_parse():
    from trust.connect import server_urls

    result = xirang("jobs", "--nats", "nats://li:secret@nats-1:4222")
    assert result.returncode == 2 and "secret" not in result.stderr and "XIRANG_CREDS" in result.stderr
    assert server_urls("tls://nats-1:4222,nats-2:4222, nats-3:4222") == [
        "tls://nats-1:4222",
        "tls://nats-2:4222",
        "tls://nats-3:4222",
    ]


def test_a_deleted_log_is_not_quietly_replaced_by_another_history(tmp_path):
    """The attack where a user deleted the log stream and the scheduler rebuilt another
    one: a scheduler whose signed snapshot covers more than the log holds refuses to lead."""
    with Cluster(tmp_path) as c:
        first = c.scheduler("s1", "--snapshot-every-events", "1")
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.send(T.Submit(job="a", team="t", user="u", level=5, gpus=1))
        c.wait_for(T.JobRunning, job="a")
        time.sleep(1.5)  # a snapshot after the last records
        c.terminate(first)

        async def recreate(nc, js):
            await js.delete_stream(bus.EV_STREAM)  # an open server: anyone may (deploy/nats forbids it)
            await bus.ensure_streams(js)

        c._run(recreate)
        c.scheduler("s2")
        deadline = time.monotonic() + 15
        while "records were deleted" not in (c.logs / "s2.log").read_text():
            assert time.monotonic() < deadline, (c.logs / "s2.log").read_text()[-2000:]
            time.sleep(0.3)
        assert not c.records()  # nothing new was written over the loss


def test_after_a_key_rotation_the_scheduler_carries_on_and_the_whole_log_audits(tmp_path):
    keys = tmp_path / "keyring"
    old_id = create_key(keys)[2]
    with Cluster(tmp_path) as c:
        first = c.scheduler("s1", "--signing-key", str(keys / "scheduler.key"))
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.terminate(first)
        new_id = create_key(keys, rotate=True)[2]
        c.scheduler("s2", "--signing-key", str(keys / "scheduler.key"))
        c.send(T.Submit(job="after", team="t", user="u", level=5, gpus=1))
        records = c.wait_for(T.JobSubmitted, job="after")
        assert {r.key for r in records if r.sig} == {old_id, new_id}
        result = xirang("audit", "--nats", c.url, "--public-key", str(keys / "scheduler.pub"), "--json")
        assert result.returncode == 0, result.stdout
