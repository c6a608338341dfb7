"""A scheduler that starts leading from a state folded from the log decides on exactly as a
re-decision of the log does: what placement passes keep between steps without an event
(the nodes held for blocked jobs) is forgotten at a recorded `scheduler_start`, by both."""

from __future__ import annotations

import msgspec

from core import types as T
from core import step
from core.log.evolve import evolve
from core.passes.placement import reserved_nodes
from core.replay import rebuild
from projections.redecide import Redecide

from scenario import MIN, Run, node, start_all, submit

URGENT_ENOUGH = submit("u", 2, 8, team="z", user="uz", est_runtime_s=12 * 3600, t=10 * MIN)


def full_pool_with_a_gang_holding_both_nodes() -> Run:
    """Two 8-GPU nodes, both busy; a 16-GPU gang blocked behind them holds both (the hold
    was made by a pass with a GPU free and is kept by every pass since, none of which
    logs anything about it)."""
    run = Run()
    run.at(0, node("n1"), node("n2"))
    run.at(1000, submit("a", 6, 8, team="x", user="ux", est_runtime_s=10 * 3600))
    start_all(run, 1500)
    run.at(2000, submit("g", 5, 16, team="y", user="uy", est_runtime_s=3600))
    run.at(3000, submit("b", 6, 8, team="x", user="ux", est_runtime_s=1800))  # backfilled
    start_all(run, 3500)
    assert sorted(reserved_nodes(run.state)) == ["n1", "n2"]
    return run


def kinds(records: list[T.Record]) -> list[str]:
    return [T.type_name(r.event) + ":" + getattr(r.event, "reason", "") for r in records]


def test_the_passes_memory_decides_so_a_folded_state_alone_would_decide_otherwise():
    # Why the start must be recorded: the same log, folded, has no holds, and preempts
    # where the state that wrote the log declines (the level-2 job would still run when the
    # gang is expected to start on either node).
    run = full_pool_with_a_gang_holding_both_nodes()
    folded = rebuild(run.records)
    _, writer = step(run.state, URGENT_ENOUGH)
    _, reader = step(folded, URGENT_ENOUGH)
    assert [r.event.reason for r in writer if isinstance(r.event, T.PreemptionDeclined)] == [
        "held_back_by_reservation"
    ]
    assert [r.event for r in reader if isinstance(r.event, T.PreemptionPlanned)]


def test_a_leader_started_from_the_folded_log_decides_as_the_writer_would_after_the_same_start():
    run = full_pool_with_a_gang_holding_both_nodes()
    folded = rebuild(run.records)
    start = T.SchedulerStart(t=5 * MIN, instance="s2")
    _, writer = step(run.state, start)
    _, reader = step(folded, start)
    assert [T.type_name(r.event) for r in reader] == ["InputAccepted", "SchedulerStarted"]
    writer += step(run.state, URGENT_ENOUGH)[1]
    reader += step(folded, URGENT_ENOUGH)[1]
    assert writer == reader  # record for record, hash chain included
    assert [r for r in reader if isinstance(r.event, T.PreemptionPlanned)]


def test_a_log_with_a_leader_change_re_decides_exactly():
    run = full_pool_with_a_gang_holding_both_nodes()
    prefix = list(run.records)
    taken_over = rebuild(prefix)  # the new leader's state
    tail = step(taken_over, T.SchedulerStart(t=5 * MIN, instance="s2"))[1]
    tail += step(taken_over, URGENT_ENOUGH)[1]
    accepted = sum(isinstance(r.event, T.InputAccepted) for r in prefix + tail)
    assert summary_of_redecision(prefix + tail) == {"same": True, "inputs": accepted}


def test_a_leader_change_left_out_of_the_log_shows_as_a_difference_when_re_deciding():
    run = full_pool_with_a_gang_holding_both_nodes()
    prefix = list(run.records)
    taken_over = rebuild(prefix)
    tail = step(taken_over, URGENT_ENOUGH)[1]  # no scheduler_start recorded
    redecide = Redecide()
    for record in prefix + tail:
        redecide.feed(record.n, T.encode(record))
    redecide.finish()
    assert redecide.summary()["first_difference"]["record"] == prefix[-1].n + 3


def test_an_internal_error_rejection_forgets_the_passes_memory_as_the_restored_state_has_none():
    run = full_pool_with_a_gang_holding_both_nodes()
    evolve(run.state, T.InputRejected(t=5 * MIN, reason=T.INTERNAL_ERROR, detail="ValueError: x"))
    assert reserved_nodes(run.state) == {} and run.state.scratch.placement_dirty


def test_only_the_scheduler_or_an_operator_may_record_a_leader_start():
    run = full_pool_with_a_gang_holding_both_nodes()
    forged = msgspec.structs.replace(T.SchedulerStart(t=5 * MIN, instance="s9"), origin="client:x:ux")
    events = run.at(5 * MIN, forged)
    assert [e.reason for e in events if isinstance(e, T.InputRejected)] == ["not_permitted_for_role"]
    assert sorted(reserved_nodes(run.state)) == ["n1", "n2"]


def summary_of_redecision(records: list[T.Record]) -> dict:
    redecide = Redecide()
    for record in records:
        redecide.feed(record.n, T.encode(record))
    redecide.finish()
    summary = redecide.summary()
    return {"same": summary["same"], "inputs": summary["inputs_redecided"]}
