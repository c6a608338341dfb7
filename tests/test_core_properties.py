"""Property tests: random clusters and workloads of thousands of steps, with the
invariants of `scenario.check_invariants` checked after every step, and replay checked against live."""

import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import rebuild, snapshot_bytes, state_digest
from core import types as T
from core.rules.holds import victim_cap
from core.model.placement import acceptable_models
from core.rules.shares import fair_shares, holding
from core.model.scratch import Scratch
from core.model.state import live_digest, rebuild_index, victim_classes

from random_world import World, run_world
from scenario import check_invariants

HERE = os.path.dirname(__file__)


def index_view(ix) -> tuple:
    return (
        ix.queues,
        ix.aging,
        ix.waiting_by_level_team,
        {k: v for k, v in ix.free_by_model.items() if v},
        {
            m: {f: sorted(b) for f, b in bs.items() if b}
            for m, bs in ix.free_buckets.items()
            if any(bs.values())
        },
        {n: sorted(j) for n, j in ix.jobs_by_node.items() if j},
        {k: v for k, v in ix.team_gpus.items() if v},
        ix.level_gpus,
        ix.total_gpus,
        ix.known_by_model,
        {m: v for m, v in ix.capacity_by_model.items() if v},
        {m: v for m, v in ix.node_size_max_by_model.items() if v},
        {m: v for m, v in ix.node_sizes_by_model.items() if v},
        ix.up_nodes_by_model,
        {k: sorted(v) for k, v in ix.holders_by_kind.items()},
        ix.victims_by_class,
        ix.victim_keys,
    )


def check_step(state, inp, records, before) -> None:
    check_invariants(state)
    if not records:
        assert snapshot_bytes(state.canonical) == before, f"{inp} emitted nothing but changed the state"
    for record in records:
        ev = record.event
        if isinstance(ev, T.PreemptionPlanned):
            preemptor = state.canonical.jobs[ev.preemptor]
            held = holding(state)  # the victims count as gone already
            shares = fair_shares(state)
            for victim_id in ev.victims:
                victim = state.canonical.jobs[victim_id]
                if ev.reclaim:
                    assert victim.team != preemptor.team, "a team reclaimed from itself"
                    assert victim.level >= state.canonical.policy.fair_share_from_level, (
                        "urgent job reclaimed"
                    )
                else:
                    assert victim.level > preemptor.level, "same or higher level preempted"
            if ev.reclaim:  # the reclaiming team stays within its share: nothing to move back
                assert held.get(preemptor.team, 0) <= shares[preemptor.team] + 1e-6, "reclaimed past share"
            # The cap is per node the preemptor's gang needs (core/rules/holds.py victim_cap).
            models = acceptable_models(preemptor.gpu_models, state.index)
            assert len(ev.victims) <= victim_cap(state, state.canonical.policy, preemptor, models)


def check_invariants_only(state, inp, records, before) -> None:
    check_invariants(state)


def run_checked(seed: int, steps: int) -> World:
    world = World(seed)
    for inp in world.boot():
        world.feed(inp)
    for _ in range(steps):
        inp = world.next_input()
        world.feed(inp, check_step, before=snapshot_bytes(world.state.canonical))
    return world


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_invariants_hold_after_every_step_of_a_random_workload(seed):
    world = run_checked(seed, 1500)
    world.settle(check_invariants_only)
    assert not world.state.canonical.sagas, "a saga neither committed nor rolled back"
    planned = {r.event.saga for r in world.records if isinstance(r.event, T.PreemptionPlanned)}
    ended = [
        r.event.saga
        for r in world.records
        if isinstance(r.event, (T.PreemptionCommitted, T.PreemptionRolledBack))
    ]
    assert sorted(ended) == sorted(planned), "every saga ends exactly once"
    victim_classes(world.state)  # (the victims touched since a decision last read them keyed)
    assert index_view(rebuild_index(world.state.canonical, Scratch())) == index_view(world.state.index)
    replayed = rebuild(world.records)
    assert state_digest(replayed.canonical) == state_digest(world.state.canonical)
    assert live_digest(world.state) == state_digest(world.state.canonical), "kept job hashes went stale"


def test_random_workloads_do_preempt_and_roll_back():
    """Guards the property test against a world too tame to exercise sagas."""
    kinds: dict[str, int] = {}
    for seed in range(6):
        for record in run_world(seed, 1500).records:
            name = type(record.event).__name__
            kinds[name] = kinds.get(name, 0) + 1
    for name in (
        "PreemptionPlanned",
        "PreemptionCommitted",
        "PreemptionRolledBack",
        "JobRequeued",
        "PriorityAged",
        "CheckpointFallback",
        "NodeLost",
        "StateDigest",
    ):
        assert kinds.get(name, 0) > 0, f"no {name} in random worlds: {kinds}"


def test_replaying_a_log_reproduces_every_state_digest():
    world = run_world(7, 3000)
    digests = [r for r in world.records if isinstance(r.event, T.StateDigest)]
    assert len(digests) >= 3
    replayed = rebuild(world.records)  # raises DigestMismatch on any difference
    assert replayed.canonical.chain == world.state.canonical.chain


def test_same_scenario_under_two_hash_seeds_gives_byte_identical_logs():
    logs = []
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "random_world.py"), "11", "2000"],
            env=env,
            capture_output=True,
            check=True,
            cwd=os.path.dirname(HERE),
        )
        logs.append(out.stdout)
    assert logs[0] == logs[1]
    assert logs[0].count(b"\n") > 2000
