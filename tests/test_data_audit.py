"""`xirang audit`: rebuilds state from the log, verifies the hash chain and every
StateDigest, locates a modified, missing or reordered record, and tells a job's history."""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest

from core import rebuild, state_digest
from core import types as T
from core.model.policy import Policy, with_params
from data_helpers import publish, start_nats, workload_records, write_jsonl, xirang
from replay.synthetic_log import Spec, generate


def _lines(records) -> list[bytes]:
    return [T.encode(r) for r in records]


def _write_lines(path, lines: list[bytes]) -> str:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def _audit(*args) -> tuple[int, dict]:
    result = xirang("audit", *args, "--json")
    return result.returncode, json.loads(result.stdout)


def test_audit_verifies_an_untouched_log_and_every_state_digest(tmp_path):
    records = workload_records()
    path = write_jsonl(str(tmp_path / "log.jsonl"), records)
    rc, summary = _audit("--log", path)
    digests = sum(isinstance(r.event, T.StateDigest) for r in records)
    assert rc == 0 and summary["ok"]
    assert summary["records_verified"] == len(records)
    assert summary["state_digests_verified"] == digests > 5
    assert summary["chain_head"] == records[-1].hash
    assert summary["state_digest"] == state_digest(rebuild(records).canonical)


def test_audit_detects_and_locates_a_modified_event(tmp_path):
    records = workload_records()
    lines = _lines(records)
    target = next(i for i, r in enumerate(records) if isinstance(r.event, T.PreemptionPlanned))
    record = msgspec.json.decode(lines[target])
    record["event"]["benefit"] = record["event"]["benefit"] * 10  # an inflated justification
    lines[target] = T.encode(record)
    rc, summary = _audit("--log", _write_lines(tmp_path / "mod.jsonl", lines))
    assert rc == 1 and not summary["ok"]
    assert summary["problem_record"] == records[target].n
    assert summary["problem_line"] == target + 1
    assert "modified" in summary["problem"]


def test_audit_detects_and_locates_a_missing_event(tmp_path):
    records = workload_records()
    lines = _lines(records)
    dropped = 1234
    del lines[dropped]
    rc, summary = _audit("--log", _write_lines(tmp_path / "drop.jsonl", lines))
    assert rc == 1
    assert f"record {records[dropped].n} missing" in summary["problem"]
    assert summary["problem_line"] == dropped + 1
    assert summary["records_verified"] == dropped


def test_audit_detects_a_reordered_event(tmp_path):
    lines = _lines(workload_records())
    lines[500], lines[501] = lines[501], lines[500]
    rc, summary = _audit("--log", _write_lines(tmp_path / "swap.jsonl", lines))
    assert rc == 1 and summary["problem_line"] == 501


def test_audit_catches_a_forger_who_recomputes_the_hashes_at_the_next_state_digest(tmp_path):
    records = list(workload_records())
    target = next(i for i, r in enumerate(records) if isinstance(r.event, T.JobSubmitted) and i > 100)
    forged_event = msgspec.structs.replace(records[target].event, gpus=records[target].event.gpus + 1)
    prev = records[target - 1].hash
    forged = []
    for i, record in enumerate(records[target:], target):
        event = forged_event if i == target else record.event
        digest = hashlib.sha256(prev.encode() + T.encode(event)).hexdigest()
        forged.append(msgspec.structs.replace(record, event=event, prev=prev, hash=digest))
        prev = digest
    path = write_jsonl(str(tmp_path / "forged.jsonl"), records[:target] + forged)
    rc, summary = _audit("--log", path)
    next_digest = next(r.n for r in records[target:] if isinstance(r.event, T.StateDigest))
    assert rc == 1 and summary["problem_record"] == next_digest
    assert "state digest" in summary["problem"]


def test_audit_to_seq_and_to_time_rebuild_the_state_of_that_moment(tmp_path):
    records = workload_records()
    path = write_jsonl(str(tmp_path / "log.jsonl"), records)
    rc, summary = _audit("--log", path, "--to-seq", "2000")
    assert rc == 0 and summary["last_record"] == 2000
    assert summary["state_digest"] == state_digest(rebuild(records[:2000]).canonical)
    cut_t = records[3000].event.t
    rc, summary = _audit("--log", path, "--to-time", str(cut_t))
    assert summary["last_t"] == cut_t
    assert summary["last_record"] == max(r.n for r in records if r.event.t <= cut_t)


def test_audit_over_jetstream_locates_a_dropped_record_by_stream_sequence(tmp_path):
    records = workload_records()[:1500]
    server = start_nats(tmp_path)
    try:
        publish(server.url, records[:700] + records[701:])
        rc, summary = _audit("--nats", server.url)
    finally:
        server.stop()
    assert rc == 1
    assert summary["problem_record"] == 702 and "record 701 missing" in summary["problem"]
    assert summary["problem_stream_seq"] > 700  # host copies share the stream


def test_audit_job_tells_its_history_in_plain_words(tmp_path):
    policy = with_params(Policy(), {"compensation_after_preemptions": 1})
    records = generate(Spec(jobs=120, seed=3, policy=policy)).records
    job = next(r.event.job for r in records if isinstance(r.event, T.CompensationGranted))
    path = write_jsonl(str(tmp_path / "log.jsonl"), records)
    result = xirang("audit", "--log", path, "--job", job)
    assert result.returncode == 0, result.stderr
    story = result.stdout.split(f"history of {job}:")[1]
    for words in (
        "queued at level",
        "preempted by",
        "because the benefit",
        "outweighed the cost",
        "released its GPUs",
        "requeued (preempted)",
        "restoring from checkpoint step",
        "compensated",
        "GPU-hours of quota",
        "in fee credit",
    ):
        assert words in story, words
    lines = [line for line in story.splitlines() if line.strip()]
    assert lines[0].strip().split("  ", 1)[1].startswith("queued at level")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--log", "/nonexistent/log.jsonl"], "does not exist"),
        (["--log", "x", "--to-seq", "-3"], "--to-seq"),
        (["--log", "x", "--to-time", "yesterday"], "ISO datetime"),
    ],
)
def test_audit_explains_bad_arguments(args, words, tmp_path):
    result = xirang("audit", *args)
    assert result.returncode == 2 and words in result.stderr
