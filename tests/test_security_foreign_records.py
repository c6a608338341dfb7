"""A message someone else appends to XR_EV (garbage, an unsigned record, a copy of a
genuine one) stops nothing: every reader passes over it (trust/foreign.py), the scheduler
records, signed, that it disowns it (`RecordDisowned`) and raises an alert, and `xirang
audit` lists it and verifies past it. XR_EV denies delete, so this is the only way on.
The live tests run a real nats-server, scheduler and host agent."""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest

from agents.local_cluster import Cluster
from core import ChainError, step
from core import types as T
from core.replay import rebuild
from core.model.state import state_digest
from data_helpers import workload_records, write_jsonl, xirang
from transport import bus
from trust.foreign import LogSorter, message_digest
from trust.signing import LogVerifier, Signer, create_key, sign_records

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def signer(tmp_path) -> Signer:
    return Signer.load(create_key(tmp_path / "keys")[0])


def signed(records, signer) -> list[T.Record]:
    """Signed as the scheduler signs: the last record of each input's run, and host records."""
    out, group = [], []
    for record in records:
        if group and record.input_seq != group[0].input_seq:
            out += sign_records(group, signer, bus.host_nodes)
            group = []
        group.append(record)
    return out + sign_records(group, signer, bus.host_nodes)


def chained_after(last: T.Record, event: T.Event, input_seq: int) -> T.Record:
    """What a writer without the key can make: a record with a perfect hash chain."""
    digest = hashlib.sha256(last.hash.encode() + T.encode(event)).hexdigest()
    return T.Record(n=last.n + 1, prev=last.hash, hash=digest, input_seq=input_seq, event=event)


def sort_all(sorter: LogSorter, payloads: list[bytes]) -> list[T.Record]:
    out = [r for pos, p in enumerate(payloads, 1) for r, _ in sorter.feed(pos, p)]
    return out + [r for r, _ in sorter.finish()]


def test_a_log_without_foreign_messages_is_released_whole_and_in_order_as_before(signer):
    records = signed(workload_records(jobs=40), signer)
    verifier = LogVerifier(signer.keyring())
    before = [r.n for record in records for r, _ in verifier.admit(record)]
    sorter = LogSorter(signer.keyring())
    after = sort_all(sorter, [T.encode_record(r) for r in records])
    assert [r.n for r in after] == before == [r.n for r in records]
    assert sorter.foreign == [] and sorter.signatures == verifier.signatures


def test_an_unsigned_record_made_to_join_the_next_input_is_set_aside_before_it_acts(signer):
    records = signed(workload_records(jobs=40), signer)
    # Unsigned records after a signed one, past the first third: the forger chains a
    # record to the signed one, with their input sequence, so it waits with them for the
    # signature that covers them.
    cut = next(i for i in range(len(records) // 3, len(records)) if records[i - 1].sig and not records[i].sig)
    evil = T.JobCancelled(t=records[cut - 1].event.t, job="nobody")
    forged = chained_after(records[cut - 1], evil, records[cut].input_seq)
    payloads = [T.encode_record(r) for r in records]
    payloads.insert(cut, T.encode_record(forged))
    sorter = LogSorter(signer.keyring())
    released = sort_all(sorter, payloads)
    assert [r.n for r in released] == [r.n for r in records]
    assert [(f.pos, f.reason) for f in sorter.foreign] == [(cut + 1, "unsigned")]
    assert state_digest(rebuild(released).canonical) == state_digest(rebuild(records).canonical)


def test_a_signed_record_whose_predecessors_are_gone_stops_the_fold(signer):
    records = signed(workload_records(jobs=20), signer)
    signed_at = [i for i, r in enumerate(records) if r.sig]
    dropped = signed_at[len(signed_at) // 2]
    payloads = [T.encode_record(r) for i, r in enumerate(records) if i != dropped]
    with pytest.raises(ChainError, match="missing"):
        sort_all(LogSorter(signer.keyring()), payloads)


def disowning(records: list[T.Record], lines: dict[int, bytes], reason: str, signer) -> list[T.Record]:
    """The scheduler's records that disown the messages at these positions, signed."""
    state = rebuild(records)
    out = []
    for pos, payload in sorted(lines.items()):
        inp = T.DisownRecord(
            t=state.canonical.t, log_seq=pos, digest=message_digest(payload), reason=reason, origin="sched:s1"
        )
        out += sign_records(step(state, inp)[1], signer, bus.host_nodes)
    return out


def test_audit_lists_garbage_and_copies_and_verifies_past_them_once_each_is_disowned(tmp_path, signer):
    public = str(tmp_path / "keys" / "scheduler.pub")
    records = signed(workload_records(jobs=30), signer)
    last_signed = next(r for r in reversed(records) if r.sig)
    altered = msgspec.structs.replace(last_signed, event=T.JobCancelled(t=last_signed.event.t, job="x"))
    foreign = [b"\x00garbage{", T.encode_record(last_signed), T.encode_record(altered)]
    log = write_jsonl(str(tmp_path / "log.jsonl"), records)
    with open(log, "ab") as fh:
        fh.write(b"\n".join(foreign) + b"\n")
    summary = json.loads(xirang("audit", "--log", log, "--public-key", public, "--json").stdout)
    assert not summary["ok"] and summary["problem_line"] == len(records) + 1
    assert "not a log record" in summary["problem"] and "not disowned" in summary["problem"]
    assert [f["reason"] for f in summary["foreign"]] == [
        "not_a_record",
        "copy_of_a_record",
        "copy_of_a_record",
    ]
    assert summary["records_verified"] == len(records)

    lines = {len(records) + 1 + i: payload for i, payload in enumerate(foreign)}
    with open(log, "ab") as fh:
        for record in disowning(records, lines, "found", signer):
            fh.write(T.encode_record(record) + b"\n")
    result = xirang("audit", "--log", log, "--public-key", public, "--json")
    summary = json.loads(result.stdout)
    assert result.returncode == 0, summary
    assert (summary["foreign_messages"], summary["disowned"]) == (3, 3)
    assert all(f["disowned_by_record"] > records[-1].n for f in summary["foreign"])
    words = xirang("audit", "--log", log, "--public-key", public).stdout
    assert "3 of them disowned by the scheduler" in words and "NOT disowned" not in words


# ---------------------------------------------------------------- live


def append_raw(c: Cluster, subject: str, payload: bytes) -> int:
    async def go(nc, js):
        ack = await js.publish(subject, payload)
        return ack.seq

    return c._run(go)


def audit(c: Cluster, tmp_path) -> tuple[int, dict]:
    result = xirang(
        "audit", "--nats", c.url, "--public-key", str(tmp_path / "keys" / "scheduler.pub"), "--json"
    )
    return result.returncode, json.loads(result.stdout)


def test_garbage_and_a_copied_record_on_the_live_log_are_disowned_and_the_cluster_goes_on(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "2xH100")
        joined = c.wait_for(T.NodeJoined, node="h1")
        # Nothing else is appended while the cluster is idle: the leader notices anyway.
        garbage_seq = append_raw(c, f"{bus.LOG_PREFIX}.JobSubmitted", b"{not json")
        c.wait_for(T.RecordDisowned, log_seq=garbage_seq, reason="not_a_record")
        genuine = next(r for r in joined if r.sig)
        copy_seq = append_raw(c, f"{bus.LOG_PREFIX}.Copy", T.encode_record(genuine))
        c.wait_for(T.RecordDisowned, log_seq=copy_seq, reason="copy_of_a_record")
        c.send(T.Submit(job="after", team="a", user="u", level=5, gpus=1))
        c.wait_for(T.JobRunning, job="after")
        rc, summary = audit(c, tmp_path)
        assert rc == 0, summary
        assert (summary["foreign_messages"], summary["disowned"]) == (2, 2)
        assert "disowned 1 foreign message" in (c.logs / "s1.log").read_text()
        projected = xirang("project", "--nats", c.url, "--db", str(tmp_path / "p.duckdb"))
        assert projected.returncode == 0, projected.stderr


def test_a_scheduler_restarted_over_an_unsigned_record_disowns_it_and_leads(tmp_path):
    """The finding: a restarted scheduler refused to lead while the log held a record it
    had not signed, and nothing could remove the record."""
    with Cluster(tmp_path) as c:
        first = c.scheduler("s1")
        c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.terminate(first)
        last = c.records()[-1]
        forged = chained_after(
            last, T.NodeLost(t=last.event.t, node="h1", reason="forged", jobs=[]), last.input_seq + 1
        )
        seq = append_raw(c, f"{bus.LOG_PREFIX}.NodeLost", T.encode_record(forged))
        rc, summary = audit(c, tmp_path)
        assert rc == 1 and summary["problem_stream_seq"] == seq and "not disowned" in summary["problem"]
        c.scheduler("s2")
        c.wait_for(T.RecordDisowned, log_seq=seq, reason="unsigned")
        c.send(T.Submit(job="after", team="a", user="u", level=5, gpus=1))
        c.wait_for(T.JobRunning, job="after")  # h1 was never lost
        rc, summary = audit(c, tmp_path)
        assert rc == 0 and summary["disowned"] == 1, summary
