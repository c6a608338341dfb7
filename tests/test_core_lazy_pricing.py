"""A preemption plan prices its victims exactly only on the nodes whose victim set could
still win (core.rules.pricing.LazyPrices, core.passes.victims.choose_on_one_node_lazily): it must come
to the very plan (or decline) that pricing every eligible victim comes to, on random
worlds, at every step, for every queued job that may preempt."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import core.passes.plan as plan_module
from core.rules.rights import may_preempt
from core.passes.plan import plan_preemption
from core.rules.pricing import price_victims
from core.model.entities import QUEUED
from random_world import World


def _every_victim_priced(d, scope, stand_ins, prices, natural_wait, guard, known_decline):
    eligible = list(prices.victims.values())
    costs = price_victims(d.state, d.job, eligible, d.policy, prices.pricing, prices.curve, prices.fit)
    choice, penalty = plan_module._choose_with_substitutes(d, scope, stand_ins, costs, prices.pricing, guard)
    return choice, penalty, costs


def _plans_compared(world: World, monkeypatch, counts: dict) -> None:
    state = world.state
    for job in list(state.canonical.jobs.values()):
        if job.state != QUEUED or not may_preempt(state.canonical.policy, job.level):
            continue
        lazy = plan_preemption(state, job)
        with monkeypatch.context() as patched:
            patched.setattr(plan_module, "_choose_priced", _every_victim_priced)
            full = plan_preemption(state, job)
        assert lazy == full, (job.id, lazy, full)
        counts[type(lazy).__name__] = counts.get(type(lazy).__name__, 0) + 1


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_lazily_priced_plans_equal_plans_with_every_victim_priced(seed, monkeypatch):
    world = World(seed)
    for inp in world.boot():
        world.feed(inp)
    counts: dict = {}
    for i in range(600):
        world.feed(world.next_input())
        if i % 3 == 0:
            _plans_compared(world, monkeypatch, counts)
    # (Some worlds queue no job that may preempt: the next test makes sure plans are compared.)


def test_lazy_pricing_picks_plans_on_a_random_world_where_some_are_made(monkeypatch):
    """One fixed world where plans are made, not only declined: the comparison covers both."""
    counts: dict = {}
    for seed in range(12):
        world = World(seed)
        for inp in world.boot():
            world.feed(inp)
        for i in range(600):
            world.feed(world.next_input())
            if i % 3 == 0:
                _plans_compared(world, monkeypatch, counts)
        if counts.get("Plan"):
            break
    assert counts.get("Plan"), counts
