"""A record the scheduler disowns (`disown_record` -> `RecordDisowned`): it is sealed into
the chain like any record, changes no state, and only the scheduler or an operator may
record one."""

from __future__ import annotations

import msgspec

from core import types as T
from core.replay import rebuild
from core.model.state import state_digest

from scenario import Run, node, submit

DISOWN = T.DisownRecord(t=5000, log_seq=7, digest="ab" * 32, reason="unsigned", problem="no signature")


def busy_run() -> Run:
    run = Run()
    run.at(0, node("n1"))
    run.at(1000, submit("a", 3, 4, team="x", user="ux", est_runtime_s=3600))
    return run


def test_a_disowned_record_is_sealed_into_the_chain_and_changes_no_state():
    run = busy_run()
    jobs_before = msgspec.json.encode(run.state.canonical.jobs)
    events = run.at(5000, msgspec.structs.replace(DISOWN, origin="sched:s1"))
    disowned = [e for e in events if isinstance(e, T.RecordDisowned)]
    assert [(e.log_seq, e.digest, e.reason) for e in disowned] == [(7, "ab" * 32, "unsigned")]
    after = run.state.canonical
    assert (after.events_n, after.t) == (run.records[-1].n, 5000)
    folded = rebuild(run.records)
    assert state_digest(folded.canonical) == state_digest(after)
    # Apart from the position in the chain and the time, nothing moved.
    assert msgspec.json.encode(after.jobs) == jobs_before


def test_only_the_scheduler_or_an_operator_may_disown_a_record():
    for origin in ("client:x:ux", "host:n1", "job:a"):
        run = busy_run()
        events = run.at(5000, msgspec.structs.replace(DISOWN, origin=origin))
        assert [e.reason for e in events if isinstance(e, T.InputRejected)] == ["not_permitted_for_role"]
    run = busy_run()
    events = run.at(5000, msgspec.structs.replace(DISOWN, origin="op:root"))
    assert [T.type_name(e) for e in events] == ["InputAccepted", "RecordDisowned"]


def test_a_disown_names_a_positive_log_sequence():
    run = busy_run()
    events = run.at(5000, msgspec.structs.replace(DISOWN, log_seq=0, origin="sched:s1"))
    assert [e.reason for e in events if isinstance(e, T.InputRejected)] == ["log_seq_must_be_positive"]
