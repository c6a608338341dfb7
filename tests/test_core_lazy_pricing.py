"""A preemption plan prices its victims exactly only on the nodes whose victim set could
still win (core.rules.pricing.LazyPrices, core.passes.bounded.choose_on_one_node_bounded),
finding them from the victims' side: it must come to the very plan (or decline) that
pricing every eligible victim on every node comes to, on random worlds, at every step, for
every queued job that may preempt, while the candidate nodes are within the budget."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import core.passes.plan as plan_module
from core.rules.rights import may_preempt
from core.passes.plan import plan_preemption
from core.rules.pricing import price_victims
from core.model.entities import QUEUED
from core.model.cordon import takes_work
from core.model.state import nodes_by_name
from core.passes.bounded import Bounded
from core.passes.victims import choose_victims
from core.rules.eligibility import eligible_victims
from random_world import World


def _every_victim_priced(d, scope, stand_ins, prices, guard):
    eligible = list(prices.victims.values())
    costs = price_victims(d.state, d.job, eligible, d.policy, prices.pricing, prices.curve, prices.fit)
    choice, penalty = plan_module._choose_with_substitutes(d, scope, stand_ins, costs, prices.pricing, guard)
    return choice, penalty, costs


def _every_node_priced(d, search, models, held, prices, budget, priced_out_at=None):
    for victim in eligible_victims(d, search.guard, models, held):
        prices.admit(victim)
    costs = {victim_id: prices.exact(victim_id) for victim_id in prices.victims}
    nodes = [
        node
        for _, node in nodes_by_name(d.state)
        if takes_work(node) and node.gpu_model in models and node.name not in held
    ]
    return Bounded(choose_victims(search, models, nodes, costs), True)


def _plans_compared(world: World, monkeypatch, counts: dict) -> None:
    state = world.state
    for job in list(state.canonical.jobs.values()):
        if job.state != QUEUED or not may_preempt(state.canonical.policy, job.level):
            continue
        lazy = plan_preemption(state, job)
        with monkeypatch.context() as patched:
            patched.setattr(plan_module, "_choose_priced", _every_victim_priced)
            patched.setattr(plan_module, "choose_on_one_node_bounded", _every_node_priced)
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


def test_nodes_whose_cheapest_cover_costs_more_than_the_best_set_are_not_priced(monkeypatch):
    """Every node holds two jobs of 4 GPUs and the urgent job needs the whole node: a node's
    bound is what its two victims cost at least together, so once the node of the youngest
    victims (the least progress to lose) is priced, the nodes of older ones are not. (A
    bound by a node's cheapest victim alone prices every node here.)"""
    import core.passes.bounded as bounded_module
    from scenario import HOUR, MIN, Run, node, of, start_all, submit
    from core import types as T

    run = Run()
    names = [f"n{i}" for i in range(6)]
    run.at(0, *[node(name) for name in names])
    for i, name in enumerate(names):
        # The nodes fill in name order: n5's jobs start last, with the least to lose.
        run.at(
            1000 + i * 10 * MIN,
            submit(f"{name}-a", 6, 4, team="search", user="li", est_runtime_s=20 * 3600),
            submit(f"{name}-b", 6, 4, team="search", user="li", est_runtime_s=20 * 3600),
        )
        start_all(run, 2000 + i * 10 * MIN)
    priced: list[str] = []
    real = bounded_module._best_on_node

    def counted(search, node, *args):
        priced.append(node.name)
        return real(search, node, *args)

    monkeypatch.setattr(bounded_module, "_best_on_node", counted)
    planned = run.at(3 * HOUR, submit("urgent", 1, 8, team="safety", user="ana", est_runtime_s=1800))
    plan = of(planned, T.PreemptionPlanned)
    assert len(plan) == 1 and plan[0].victims == ["n5-a", "n5-b"]
    # n5, and a node or two whose victims' lower prices come close to n5's exact ones.
    assert priced[0] == "n5" and len(priced) <= 2, priced
