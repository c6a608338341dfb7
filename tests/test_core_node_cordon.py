"""A cordoned node takes no new work: a host that reports itself unhealthy cordons itself
(and only itself), an operator cordons any node; placement, reservations and preemption
victims stay off it, its running jobs go on, `explain` names it, and uncordoning puts it back.
Given inputs, expect events."""

from __future__ import annotations

import msgspec
import pytest

from core import types as T
from core.explain import NODE_CORDONED, explain
from core.model.state import rebuild_index
from core.model.scratch import Scratch

from random_world import World
from scenario import HOUR, MIN, Run, check_invariants, node, of, start_all, submit


def unhealthy(name: str, why: str = "disk almost full: 3 MiB free", **kw) -> T.NodeHealth:
    return T.NodeHealth(node=name, healthy=False, reason=why, **kw)


def healthy(name: str, **kw) -> T.NodeHealth:
    return T.NodeHealth(node=name, healthy=True, **kw)


def placed_on(events, job: str) -> list[str]:
    return [
        e.nodes for e in events if isinstance(e, (T.JobStartRequested, T.JobResumeRequested)) and e.job == job
    ]


def index_is_rebuilt_the_same(run: Run) -> None:
    """The free-GPU index kept through cordons equals one built from the entities."""
    kept, fresh = run.state.index, rebuild_index(run.state.canonical, Scratch())
    assert kept.total_gpus == fresh.total_gpus
    for name in ("free_by_model", "capacity_by_model", "node_size_max_by_model"):
        # (a model whose nodes all left keeps a key at 0 until the index is rebuilt, as ever)
        assert {m: n for m, n in getattr(kept, name).items() if n} == {
            m: n for m, n in getattr(fresh, name).items() if n
        }, name

    def buckets(ix) -> dict:
        return {
            m: {f: sorted(b) for f, b in bs.items() if b}
            for m, bs in ix.free_buckets.items()
            if any(bs.values())
        }

    assert buckets(kept) == buckets(fresh)


def two_nodes_one_job_on_h1() -> Run:
    run = Run()
    run.at(1, node("h1", gpus=4), node("h2", gpus=4))
    assert placed_on(run.at(2, submit("old", 5, 2)), "old") == [["h1"]]
    start_all(run, 3)
    return run


def test_an_unhealthy_host_is_cordoned_new_work_lands_elsewhere_and_its_jobs_run_on():
    run = two_nodes_one_job_on_h1()
    cordoned = of(run.at(10, unhealthy("h1")), T.NodeCordoned)
    assert [(e.node, e.by) for e in cordoned] == [("h1", "host:h1")]
    assert "disk almost full" in cordoned[0].reason
    assert placed_on(run.at(11, submit("new", 5, 2)), "new") == [["h2"]]
    index_is_rebuilt_the_same(run)
    assert run.job_state("old") == "running"  # not evicted, still managed
    assert of(run.at(12, T.CheckpointSaved(job="old", step=1, digest="d1", bytes=1)), T.CheckpointRecorded)
    assert of(run.at(13, T.Finished(job="old", ok=True)), T.JobFinished)
    index_is_rebuilt_the_same(run)
    # Its GPUs are free now, yet nothing lands there while it is cordoned.
    assert placed_on(run.at(14, submit("more", 5, 4)), "more") == []
    assert explain(run.state, "more").code == NODE_CORDONED
    assert "h1 (by host:h1: disk almost full" in explain(run.state, "more").reason
    # Space returns: the host says so, it is uncordoned, and the waiting job lands on it.
    events = run.at(20, healthy("h1"))
    assert [(e.node, e.by) for e in of(events, T.NodeUncordoned)] == [("h1", "host:h1")]
    assert placed_on(events, "more") == [["h1"]]
    index_is_rebuilt_the_same(run)
    check_invariants(run.state)


def test_repeated_health_reports_log_nothing():
    run = two_nodes_one_job_on_h1()
    assert run.at(5, healthy("h1")) == []
    assert of(run.at(6, unhealthy("h1")), T.NodeCordoned)
    assert run.at(7, unhealthy("h1", "another problem")) == []
    assert run.state.canonical.nodes["h1"].cordon_reason.startswith("disk almost full")


def test_an_operators_cordon_is_the_operators_to_lift_and_outlasts_a_restart():
    run = two_nodes_one_job_on_h1()
    events = run.at(5, T.CordonNode(node="h2", reason="swapping a PSU", by="ana"))
    assert [(e.node, e.by, e.reason) for e in of(events, T.NodeCordoned)] == [
        ("h2", "op:ana", "swapping a PSU")
    ]
    assert (
        run.at(6, unhealthy("h2")) == [] and run.at(7, healthy("h2")) == []
    )  # the host neither replaces nor lifts it
    assert run.state.canonical.nodes["h2"].cordoned_by == "op:ana"
    run.at(8, T.NodeDown(node="h2"))
    run.at(9, node("h2", gpus=4))
    assert run.state.canonical.nodes["h2"].cordoned_by == "op:ana"  # back up, still cordoned
    assert placed_on(run.at(10, submit("new", 5, 4)), "new") == []
    index_is_rebuilt_the_same(run)
    events = run.at(11, T.UncordonNode(node="h2", by="ana"))
    assert [(e.node, e.by) for e in of(events, T.NodeUncordoned)] == [("h2", "op:ana")]
    assert placed_on(events, "new") == [["h2"]]


def test_a_hosts_own_cordon_ends_with_a_restart_and_an_operator_may_lift_it():
    run = two_nodes_one_job_on_h1()
    run.at(5, unhealthy("h2"))
    run.at(6, T.NodeDown(node="h2"))
    run.at(7, node("h2", gpus=4))
    assert run.state.canonical.nodes["h2"].cordoned_by == ""  # its agent reports again if still unhealthy
    run.at(8, unhealthy("h2"))
    assert of(run.at(9, T.UncordonNode(node="h2", by="ana")), T.NodeUncordoned)
    index_is_rebuilt_the_same(run)


def test_bad_cordons_are_refused_with_what_to_fix():
    run = two_nodes_one_job_on_h1()
    reasons = [
        e.reason
        for inp in (
            T.CordonNode(node="h1", reason="  ", by="ana"),
            T.CordonNode(node="h9", reason="gone", by="ana"),
            T.UncordonNode(node="h1", by="ana"),
            unhealthy("h9"),
        )
        for e in of(run.at(5, inp), T.InputRejected)
    ]
    assert reasons == ["reason_must_be_set", "unknown_node", "node_not_cordoned", "unknown_node"]


def test_no_preemption_victim_is_chosen_on_a_cordoned_node():
    run = Run()
    run.at(1, node("h1", gpus=4), node("h2", gpus=4))
    run.at(2, submit("batch1", 7, 4), submit("batch2", 7, 4))
    start_all(run, 3)
    on = {j: run.job(j).placement[0].node for j in ("batch1", "batch2")}
    cordoned_node = on["batch1"]
    run.at(10 * MIN, T.CordonNode(node=cordoned_node, reason="maintenance", by="ana"))
    events = run.at(20 * MIN, submit("urgent", 0, 4))
    planned = of(events, T.PreemptionPlanned)
    assert [p.victims for p in planned] == [["batch2"]]
    assert all(slot.node != cordoned_node for p in planned for slot in p.placement)
    assert run.job_state("batch1") == "running"


def test_no_preemption_when_the_only_victims_are_on_a_cordoned_node():
    run = Run()
    run.at(1, node("h1", gpus=4))
    run.at(2, submit("batch", 7, 4))
    start_all(run, 3)
    run.at(10 * MIN, unhealthy("h1"))
    events = run.at(20 * MIN, submit("urgent", 0, 4)) + run.at(21 * MIN, T.Tick())
    assert of(events, T.PreemptionPlanned) == [] and run.job_state("batch") == "running"
    assert explain(run.state, "urgent").code == NODE_CORDONED


def test_no_reservation_is_made_on_a_cordoned_node():
    run = Run(starvation_wait_ms=HOUR)
    run.at(1, node("h1", gpus=4), node("h2", gpus=4))
    run.at(2, submit("long1", 6, 3, est_runtime_s=10 * 3600), submit("long2", 6, 2, est_runtime_s=5 * 3600))
    start_all(run, 3)
    run.at(4, T.CordonNode(node="h2", reason="maintenance", by="ana"))
    run.at(5, submit("gang", 6, 4))
    run.at(2 * HOUR, T.Tick())
    reserved = run.state.scratch.reserved_nodes
    assert reserved and "h2" not in reserved, reserved
    assert msgspec.json.encode(sorted(reserved)) == b'["h1"]'


class CordoningWorld(World):
    """A random world whose nodes are now and then cordoned and uncordoned, by themselves
    (health reports) and by an operator."""

    def next_input(self) -> T.Input:
        rng = self.rng
        if rng.random() >= 0.06:
            return super().next_input()
        name = rng.choice(self.nodes)[0]
        roll = rng.random()
        if roll < 0.4:
            return T.NodeHealth(t=self.t, node=name, healthy=roll < 0.2, reason="disk almost full")
        if roll < 0.7:
            return T.CordonNode(t=self.t, node=name, reason="maintenance", by="ana")
        return T.UncordonNode(t=self.t, node=name, by="ana")


@pytest.mark.parametrize("seed", range(6))
def test_on_random_worlds_no_new_work_lands_on_a_cordoned_node_and_the_index_stays_whole(seed):
    world = CordoningWorld(seed)
    run = Run()
    run.state = world.state
    cordons = 0
    for inp in world.boot():
        world.feed(inp)
    for _ in range(600):
        records = world.feed(world.next_input())
        nodes = world.state.canonical.nodes
        for record in records:
            ev = record.event
            cordons += isinstance(ev, T.NodeCordoned)
            fresh = isinstance(ev, T.JobStartRequested) or (
                isinstance(ev, T.JobResumeRequested) and ev.reason != "rolled_back"
            )
            placed = ev.placement if fresh or isinstance(ev, T.PreemptionPlanned) else []
            assert all(not nodes[slot.node].cordoned_by for slot in placed), (seed, record.n, ev)
        index_is_rebuilt_the_same(run)
        check_invariants(world.state)
    assert cordons >= 3
