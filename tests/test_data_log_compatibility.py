"""Logs written by older releases keep auditing: the golden logs in tests/data/golden-logs
(the same inputs, `inputs.jsonl`, run through `xirang replay run` by a release of 2026-11-29, by
the last release before digest schemas (2026-12-01), and by a release with digest schema 2;
see the README there) must fold and verify forever, hash chain and every state digest, and
a changed byte in any of them must still be found and named by its record number."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from core import new_state, snapshot_bytes, state_digest
from core import types as T
from core.log.digest import LEGACY_RELEASES
from core.model.policy import Policy
from core.replay import apply_record
from core.model.entities import Job
from data_helpers import publish, start_nats, xirang
from transport import bus
from trust.signing import Signer, create_key

GOLDEN = Path(__file__).parent / "data" / "golden-logs"
LOGS = (
    "written-by-276a06d.jsonl",
    "written-by-dac0952.jsonl",
    "written-with-digest-schema-2.jsonl",
    "written-with-defaults-version-2.jsonl",
)


def _lines(name: str) -> list[bytes]:
    return (GOLDEN / name).read_bytes().splitlines()


def _audit(path: Path, *args: str) -> dict:
    result = xirang("audit", "--log", str(path), "--json", *args)
    summary = json.loads(result.stdout)
    assert result.returncode == (0 if summary["ok"] else 1)
    return summary


def _fold(lines: list[bytes]):
    state = new_state()
    for line in lines:
        apply_record(state, T.decode_record(line))
    return state


def _digest_records(lines: list[bytes]) -> list[int]:
    return [n for n, line in enumerate(lines, 1) if b'"type":"StateDigest"' in line]


@pytest.mark.parametrize("name", LOGS)
def test_the_log_of_each_release_audits_clean_with_every_state_digest(name):
    lines = _lines(name)
    summary = _audit(GOLDEN / name)
    assert summary["ok"], summary.get("problem")
    assert summary["records_verified"] == summary["last_record"] == len(lines) > 100
    assert summary["state_digests_verified"] == len(_digest_records(lines)) >= 25
    schema = "1" if name.startswith("written-by-") else "3" if "defaults-version-2" in name else "2"
    assert summary["state_digest_schemas"] == {schema: summary["state_digests_verified"]}
    assert len(summary["legacy_digest_releases"]) == (schema == "1")


def test_the_oldest_log_really_lacks_what_the_types_have_gained_since():
    """What makes the test above mean something: re-encoding the old log's events with
    today's types gives other bytes (new fields with their defaults), its digests are of
    schema 1, and the state's types, policy defaults included, have changed since."""
    lines = _lines(LOGS[0])
    records = [T.decode_record(line) for line in lines]
    submitted = [r for r in records if isinstance(r.event, T.JobSubmitted)]
    assert submitted and all(T.chain_hash(r.prev, T.encode(r.event)) != r.hash for r in submitted)
    assert all(b"safe_point_interval_s" not in line for line in lines)
    digests = [r.event for r in records if isinstance(r.event, T.StateDigest)]
    assert digests and all(
        d.schema == 1 and b'"schema"' not in line
        for d, line in zip(digests, (x for x in lines if b"StateDigest" in x))
    )
    state = _fold(lines)
    matched = LEGACY_RELEASES[state.scratch.legacy_digest_release]
    assert matched.name == "releases from 5d0ba91 (2026-11-29 17:15) until acdb637"
    # Its release's default for fair_share_guarantee differs from today's, and the log's
    # digests before its second set_policy (which sets it) were made under that default.
    assert matched.policy_defaults["fair_share_guarantee"] != Policy().fair_share_guarantee
    changes = [n for n, r in enumerate(records, 1) if isinstance(r.event, T.PolicyChanged)]
    assert "fair_share_guarantee" in records[changes[1] - 1].event.params
    assert "fair_share_guarantee" not in records[changes[0] - 1].event.params
    assert len([n for n in _digest_records(lines) if n < changes[1]]) >= 15
    assert "safe_point_interval_ms" not in matched.fields["Job"]
    newest = _fold(_lines(LOGS[1]))
    assert LEGACY_RELEASES[newest.scratch.legacy_digest_release] is LEGACY_RELEASES[0]


def _change(line: bytes, old: bytes, new: bytes) -> bytes:
    assert old in line, (old, line[:200])
    return line.replace(old, new, 1)


@pytest.mark.parametrize("name", LOGS)
def test_a_changed_byte_is_located_by_its_record_number(name, tmp_path):
    lines = _lines(name)
    submitted = next(n for n, line in enumerate(lines, 1) if b'"type":"JobSubmitted"' in line)
    digest = _digest_records(lines)[3]
    for n, old, new in ((submitted, b'"gpus":4', b'"gpus":5'), (digest, b'"digest":"', b'"digest":"f')):
        changed = list(lines)
        changed[n - 1] = _change(lines[n - 1], old, new)
        path = tmp_path / f"changed-{n}.jsonl"
        path.write_bytes(b"\n".join(changed) + b"\n")
        summary = _audit(path)
        assert not summary["ok"]
        assert summary["problem_record"] == summary["problem_line"] == n
        assert "content does not match its hash" in summary["problem"]


def _rehash_from(lines: list[bytes], first: int) -> list[bytes]:
    """A forger's log: the records from `first` on re-hashed over their events as they
    are now, so that the chain holds again."""
    out = list(lines[: first - 1])
    prev = T.decode_record(out[-1]).hash
    for line in lines[first - 1 :]:
        record = msgspec.json.decode(line)
        event_bytes = T.encode(record["event"])  # generic: exactly the keys the record has
        record["prev"], record["hash"] = prev, T.chain_hash(prev, event_bytes)
        prev = record["hash"]
        out.append(T.encode(record))
    return out


@pytest.mark.parametrize("name", LOGS)
def test_a_forger_who_rehashes_the_chain_is_caught_at_the_next_state_digest(name, tmp_path):
    lines = _lines(name)
    submitted = next(
        n
        for n, line in enumerate(lines, 1)
        if b'"job":"pretrain"' in line and b'"type":"JobSubmitted"' in line
    )
    changed = list(lines)
    changed[submitted - 1] = _change(lines[submitted - 1], b'"gpus":8', b'"gpus":6')
    forged = _rehash_from(changed, submitted)
    path = tmp_path / "forged.jsonl"
    path.write_bytes(b"\n".join(forged) + b"\n")
    summary = _audit(path)
    next_digest = min(n for n in _digest_records(lines) if n > submitted)
    assert not summary["ok"] and summary["problem_record"] == next_digest
    assert "state digest" in summary["problem"]


class _JobGrown(Job, kw_only=True, omit_defaults=True):
    """Job as a later release might have it: one more field, with a default."""

    drained_ms: int = 0


def test_a_field_added_with_its_default_leaves_schema_2_digests_as_they_were():
    lines = _lines(LOGS[2])
    state = _fold(lines)
    c = state.canonical
    recorded = T.decode_record(lines[_digest_records(lines)[-1] - 1]).event
    assert recorded.schema == 2
    before = state_digest(c)
    grown = msgspec.structs.replace(
        c, jobs={job_id: _JobGrown(**msgspec.structs.asdict(job)) for job_id, job in c.jobs.items()}
    )
    assert c.jobs and state_digest(grown) == before
    moved = msgspec.structs.replace(grown, jobs={**grown.jobs})
    first = sorted(moved.jobs)[0]
    moved.jobs[first] = msgspec.structs.replace(moved.jobs[first], drained_ms=5)
    assert state_digest(moved) != before  # the digest does see the field once it is set
    # A policy default changed by a later release is not part of the log: same digest.
    changed_default = msgspec.structs.replace(
        c,
        policy=msgspec.structs.replace(
            c.policy, preemption_candidates_max=c.policy.preemption_candidates_max + 1
        ),
    )
    assert "preemption_candidates_max" in c.policy_params  # ... unless the log set it
    assert state_digest(changed_default) == before
    changed_default = msgspec.structs.replace(
        c, policy=msgspec.structs.replace(c.policy, checkpoints_kept=c.policy.checkpoints_kept + 1)
    )
    assert "checkpoints_kept" not in c.policy_params and state_digest(changed_default) == before


def test_the_vocabulary_only_grows_and_only_with_defaults():
    """Tags are never dropped or reused, fields never dropped, and a field added to an event,
    an input or a digested state type has a default (else older logs stop decoding, or their
    digests change). A new tag or field is fine: this frozen copy never needs updating."""
    import core.model.policy as P
    import core.model.entities as S

    frozen = json.loads((GOLDEN / "vocabulary.json").read_text())
    now = {
        "events": {c.__struct_config__.tag: c for c in T.Event.__args__},
        "inputs": {c.__struct_config__.tag: c for c in T.Input.__args__},
        "state": {
            c.__name__: c
            for c in (
                S.Canonical,
                S.Job,
                S.Node,
                S.Saga,
                S.Window,
                S.Estimate,
                S.LevelWait,
                S.Ledger,
                S.Checkpoint,
                T.Slot,
                P.Policy,
                T.Record,
            )
        },
    }
    problems = []
    for kind, types in frozen.items():
        for name, was in types.items():
            cls = now[kind].get(name)
            if cls is None:
                problems.append(f"{kind} {name} is gone")
                continue
            fields = {f.name: f for f in msgspec.inspect.type_info(cls).fields}
            problems += [f"{name}.{f} is gone" for f in was["fields"] if f not in fields]
            problems += [
                f"{name}.{f} was added without a default"
                for f, info in fields.items()
                if info.required and f not in was["required"]
            ]
    assert not problems


def test_an_old_log_signed_as_it_was_stored_verifies_and_a_changed_byte_is_named(tmp_path):
    """Signatures cover n, input_seq and the chain hash, never re-encoded event bytes: an old
    log's records signed (and written back with their events as stored) verify."""
    private, public, _ = create_key(tmp_path / "keys")
    signer = Signer.load(private)
    signed = [T.encode_record(signer.sign_record(T.decode_record(line))) for line in _lines(LOGS[0])]
    path = tmp_path / "signed.jsonl"
    path.write_bytes(b"\n".join(signed) + b"\n")
    summary = _audit(path, "--public-key", str(public))
    assert summary["ok"], summary.get("problem")
    assert summary["signatures"].startswith(f"{len(signed)} verified")
    signed[9] = _change(signed[9], b'"t":', b'"t":1')
    path.write_bytes(b"\n".join(signed) + b"\n")
    summary = _audit(path, "--public-key", str(public))
    assert not summary["ok"] and summary["problem_record"] == 10


def test_a_standby_scheduler_and_the_projector_fold_an_old_log_from_jetstream(tmp_path):
    lines = _lines(LOGS[0])
    head = T.decode_record(lines[-1]).hash
    server = start_nats(tmp_path)
    try:
        publish(server.url, [T.decode_record(line) for line in lines])  # as stored

        async def standby():
            nc, js = await bus.connect(server.url)
            try:
                # An older release's snapshot (no digest_schema in its meta) of an early
                # point: not used, since its state lacks what this release's digests cover.
                early = _fold(lines[:40])
                store = await js.object_store(bus.SNAP_BUCKET)
                meta = {"ev_seq": 40, "events_n": 40}
                await store.put(
                    bus.SNAP_OBJECT, json.dumps(meta).encode() + b"\n" + snapshot_bytes(early.canonical)
                )
                stats: dict = {}
                state, _ = await bus.load_state(js, stats=stats)
                return state, stats
            finally:
                await nc.close()

        state, stats = asyncio.run(standby())
        assert state.canonical.events_n == len(lines) and state.canonical.chain == head
        assert stats == {"snapshot_seq": 0, "tail_records": len(lines)}
        audit = json.loads(xirang("audit", "--nats", server.url, "--json").stdout)
        assert audit["ok"] and audit["state_digests_verified"] == len(_digest_records(lines))
        db = str(tmp_path / "p.duckdb")
        projected = xirang("project", "--nats", server.url, "--db", db)
        assert projected.returncode == 0, projected.stderr
    finally:
        server.stop()
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        assert con.execute("SELECT last_n, last_hash FROM projector_position").fetchone() == (
            len(lines),
            head,
        )
    finally:
        con.close()


def test_a_log_an_upgraded_scheduler_went_on_writing_audits_across_the_upgrade(tmp_path):
    """The old release's records (schema-1 digests) and then this release's (its schema),
    as after a scheduler upgrade that folded the old log and went on deciding."""
    from core.model.state import DIGEST_SCHEMA
    from core.replay import run_inputs

    lines = _lines(LOGS[0])
    state = _fold(lines)
    t = state.canonical.t
    more = [
        T.Submit(
            t=t + 1000,
            job=f"after-{i}",
            team="lm",
            user="kim",
            level=5,
            gpus=2,
            gpu_models=["A100"],
            est_runtime_s=600,
        )
        for i in range(6)
    ] + [T.Tick(t=t + 5000)]
    appended = [T.encode_record(r) for r in run_inputs(more, state)]
    assert any(f'"schema":{DIGEST_SCHEMA}'.encode() in line for line in appended)
    path = tmp_path / "upgraded.jsonl"
    path.write_bytes(b"\n".join(lines + appended) + b"\n")
    summary = _audit(path)
    assert summary["ok"], summary.get("problem")
    assert summary["records_verified"] == len(lines) + len(appended)
    assert summary["state_digests_verified"] == len(_digest_records(lines + appended))


def _write(path: Path, records) -> Path:
    path.write_bytes(b"".join(T.encode_record(r) + b"\n" for r in records))
    return path


def _inputs() -> list[T.Input]:
    return [T.parse_input(line) for line in (GOLDEN / "inputs.jsonl").read_bytes().splitlines()]


def test_redecide_makes_every_decision_of_a_log_this_release_wrote_again(tmp_path):
    from core.replay import run_inputs

    path = _write(tmp_path / "fresh.jsonl", run_inputs(_inputs()))
    summary = _audit(path, "--redecide")
    accepted = sum(b'"type":"InputAccepted"' in line for line in path.read_bytes().splitlines())
    assert summary["ok"] and summary["redecide"] == {
        "inputs_redecided": accepted,
        "same": True,
        "policy_defaults": f"version {Policy().defaults_version} (named by the log)",
    }


def test_redecide_names_the_first_decision_that_other_rules_made_differently(tmp_path):
    """A log decided under other policy defaults than this release has for the version it
    names (a branch that edited a defaults table) verifies, and re-deciding says where this
    release's defaults first decide otherwise."""
    from core.model import policy_defaults
    from core.replay import run_inputs

    version = Policy().defaults_version
    with pytest.MonkeyPatch.context() as patch:  # the writer's table: never worth preempting
        table = {**policy_defaults.DEFAULTS_BY_VERSION[version], "net_benefit_min": 1e12}
        patch.setitem(policy_defaults.DEFAULTS_BY_VERSION, version, table)
        records = list(run_inputs(_inputs(), new_state(policy_defaults.defaults_of(version))))
    assert records[0].event.params == {"defaults_version": version}
    assert not any(isinstance(r.event, T.PreemptionPlanned) for r in records)
    summary = _audit(_write(tmp_path / "other-defaults.jsonl", records), "--redecide")
    assert summary["ok"], summary.get("problem")
    first = summary["redecide"]["first_difference"]
    declined = next(r for r in records if isinstance(r.event, T.PreemptionDeclined))
    assert summary["redecide"]["same"] is False and first["record"] == declined.n
    assert "PreemptionDeclined" in first["recorded"] and "PreemptionPlanned" in first["this_release"]
    assert "decided under other rules" in summary["redecide_words"]


def test_redecide_on_the_oldest_log_uses_its_releases_policy_defaults_and_never_fails_the_audit():
    summary = _audit(GOLDEN / LOGS[0], "--redecide")
    assert summary["ok"]
    assert summary["redecide"]["policy_defaults"] == summary["legacy_digest_releases"][0]
    assert summary["redecide"]["inputs_redecided"] >= 1


def test_a_log_rewritten_by_another_json_tool_still_verifies_over_the_same_keys(tmp_path):
    """Spaces, another key order, escaped non-ASCII: the hash is then checked over the same
    keys and values put back into canonical form, so only a changed key or value fails."""

    def rewrite(obj):
        if isinstance(obj, dict):
            return {k: rewrite(obj[k]) for k in reversed(list(obj))}
        return [rewrite(x) for x in obj] if isinstance(obj, list) else obj

    lines = _lines(LOGS[0])
    rewritten = [json.dumps(rewrite(json.loads(line)), ensure_ascii=True).encode() for line in lines]
    assert all(a != b for a, b in zip(lines, rewritten))
    path = tmp_path / "rewritten.jsonl"
    path.write_bytes(b"\n".join(rewritten) + b"\n")
    assert _audit(path)["ok"]
    n = next(n for n, line in enumerate(rewritten, 1) if b'"JobSubmitted"' in line)
    rewritten[n - 1] = _change(rewritten[n - 1], b'"gpus": 4', b'"gpus": 3')
    path.write_bytes(b"\n".join(rewritten) + b"\n")
    summary = _audit(path)
    assert not summary["ok"] and summary["problem_record"] == n


def test_an_event_type_of_a_newer_release_is_named_as_such(tmp_path):
    lines = _lines(LOGS[2])
    n = next(n for n, line in enumerate(lines, 1) if b'"type":"JobRunning"' in line)
    lines[n - 1] = _change(lines[n - 1], b'"type":"JobRunning"', b'"type":"JobRunningFaster"')
    path = tmp_path / "newer.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    summary = _audit(path)
    assert not summary["ok"] and summary["problem_record"] == n
    assert "written by a newer xirang" in summary["problem"]


def test_an_adopted_unsigned_history_is_trusted_exactly_up_to_its_head(tmp_path):
    """`xirang key adopt`: the key vouches for records 1..n of a log written before signing;
    a re-hashed forgery, a cut log, a record appended after n, or an altered adoption line
    are each refused and named."""
    from trust.signing import KeyFileError, KeyRing

    lines = _lines(LOGS[0])
    path = tmp_path / "old.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    keys = tmp_path / "keys"
    create_key(keys)
    adopt = xirang("key", "adopt", "--dir", str(keys), "--log", str(path), "--json")
    assert adopt.returncode == 0, adopt.stderr
    keyring = keys / "scheduler.pub"
    assert KeyRing.load(keyring).adopted.n == len(lines)
    assert _audit(path, "--public-key", str(keyring))["ok"]

    def audited(changed: list[bytes]) -> dict:
        path.write_bytes(b"\n".join(changed) + b"\n")
        return _audit(path, "--public-key", str(keyring))

    forged = _rehash_from([*lines[:9], _change(lines[9], b'"t":', b'"t":1'), *lines[10:]], 10)
    summary = audited(forged)
    assert (
        summary["problem_record"] == len(lines)
        and "head of the history the keyring adopted" in summary["problem"]
    )
    summary = audited(lines[:-1])
    assert summary["problem_record"] == 1 and "before record" in summary["problem"]
    more = T.encode_record(next(r for r in _fold_records(lines, T.Tick(t=10**7))))
    summary = audited([*lines, more])
    assert summary["problem_record"] == len(lines) + 1 and "not signed by the scheduler" in summary["problem"]
    text = keyring.read_text()
    keyring.write_text(text.replace(f"adopted {len(lines)} ", f"adopted {len(lines) - 1} "))
    with pytest.raises(KeyFileError, match="does not verify"):
        KeyRing.load(keyring)


def _fold_records(lines: list[bytes], *inputs: T.Input):
    from core.replay import run_inputs

    return run_inputs(list(inputs), _fold(lines))


def test_every_default_of_a_digested_entity_is_one_a_schema_2_digest_leaves_out():
    """msgspec leaves out a field at its default only for plain defaults and empty lists or
    dicts: a field whose default comes from a factory of its own would enter every digest,
    and older logs' digests would change (core/log/digest.py)."""
    import core.model.entities as S

    odd = [
        f"{cls.__name__}.{f.name}"
        for cls in (S.Job, S.Node, S.Saga, S.Window, S.Estimate, S.LevelWait, S.Ledger, S.Checkpoint, T.Slot)
        for f in msgspec.inspect.type_info(cls).fields
        if f.default_factory not in (msgspec.NODEFAULT, list, dict)
    ]
    assert not odd
    assert all(cls.__struct_config__.omit_defaults for cls in (S.Job, S.Node, S.Saga, S.Ledger, S.Checkpoint))


def test_the_signed_golden_log_verifies_under_its_keyring_and_names_a_changed_byte(tmp_path):
    name = "signed-with-digest-schema-2.jsonl"
    keyring = str(GOLDEN / "signed-with-digest-schema-2.pub")
    lines = _lines(name)
    summary = _audit(GOLDEN / name, "--public-key", keyring)
    signed = sum(b'"sig":' in line for line in lines)
    assert summary["ok"] and summary["signatures"].startswith(f"{signed} verified") and signed >= 30
    assert "no public key" in _audit(GOLDEN / name)["problem"]
    n = next(n for n, line in enumerate(lines, 1) if b'"sig":' in line and b'"JobStartRequested"' in line)
    lines[n - 1] = _change(lines[n - 1], b'"sig":"', b'"sig":"A')
    path = tmp_path / "changed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    summary = _audit(path, "--public-key", keyring)
    assert not summary["ok"] and summary["problem_record"] == n and "does not verify" in summary["problem"]
