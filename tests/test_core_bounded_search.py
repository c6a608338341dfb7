"""Past its budget of candidate nodes (`preemption_candidate_nodes_max`) the search for a
one-node job's victim set takes the best set it priced and records how much cheaper a set
it did not price could be (core/passes/bounded.py): on random worlds with a budget of one
node, the set every node's pricing finds is never cheaper than the bounded search's by more
than the gap it records, a whole search finds exactly that set, and a plan made past the
budget carries the gap on its PreemptionPlanned."""

from __future__ import annotations

import random

import msgspec
import pytest

import core.passes.plan as plan_module
from core import types as T
from core.model.entities import QUEUED
from core.model.cordon import takes_work
from core.model.state import nodes_by_name
from core.passes.plan import plan_preemption
from core.passes.victims import choose_victims, set_price
from core.rules.eligibility import eligible_victims
from core.rules.rights import may_preempt
from projections.audit import Audit
from random_world import World
from scenario import HOUR, MIN, Run, node, of, start_all, submit


def _full_choice(found: dict):
    d, search, models, held, prices = (found[k] for k in ("d", "search", "models", "held", "prices"))
    for victim in eligible_victims(d, search.guard, models, held):
        prices.admit(victim)
    costs = {victim_id: prices.exact(victim_id) for victim_id in prices.victims}
    nodes = [
        node
        for _, node in nodes_by_name(d.state)
        if takes_work(node) and node.gpu_model in models and node.name not in held
    ]
    return choose_victims(search, models, nodes, costs), costs


def _searches_compared(world: World, monkeypatch, counts: dict) -> None:
    state = world.state
    real = plan_module.choose_on_one_node_bounded
    for job in list(state.canonical.jobs.values()):
        if job.state != QUEUED or not may_preempt(state.canonical.policy, job.level):
            continue
        found: dict = {}

        def capturing(d, search, models, held, prices, budget, priced_out_at=None):
            result = real(d, search, models, held, prices, 1, priced_out_at)
            found.update(d=d, search=search, models=models, held=held, prices=prices, result=result)
            return result

        with monkeypatch.context() as patched:
            patched.setattr(plan_module, "choose_on_one_node_bounded", capturing)
            plan_preemption(state, job)
        if not found or isinstance(found["result"], str):
            continue
        bounded = found["result"]
        full, costs = _full_choice(found)
        if bounded.whole:
            assert bounded.choice == full, (job.id, bounded.choice, full)
            counts["whole"] = counts.get("whole", 0) + 1
            continue
        # The budget is spent only once a set is found; the set found is no worse than by the gap.
        assert bounded.choice is not None and full is not None
        pricing = found["search"].priced
        cheapest = set_price(costs, full[0], pricing)
        taken = set_price(costs, bounded.choice[0], pricing)
        slack = 1e-9 * max(1.0, taken)
        assert cheapest <= taken + slack
        assert taken - bounded.regret <= cheapest + slack, (job.id, taken, bounded.regret, cheapest)
        counts["bounded"] = counts.get("bounded", 0) + 1
        counts["missed"] = counts.get("missed", 0) + (bounded.choice != full)


class _BusyPool:
    """A pool of 8-GPU nodes kept full by jobs of levels 4-7, 1-8 GPUs, with and without
    checkpoints, started at different times, some of them saving checkpoints: many
    candidate nodes for an urgent job, of victims alike and not."""

    def __init__(self, seed: int, grid_ms: int) -> None:
        self.rng = random.Random(seed)
        self.world = World(seed)
        self.t = 0
        self.n = 0
        self.world.state = Run(release_curve_grid_ms=grid_ms).state
        for i in range(self.rng.randint(6, 12)):
            self.world.feed(node(f"n{i:02d}", t=0))

    def fill(self) -> None:
        rng = self.rng
        for _ in range(rng.randint(3, 10)):
            self.t += rng.randint(1, 20) * MIN
            self.n += 1
            interval = rng.choice([0, 0, 1800, 3600])
            self.world.feed(
                submit(
                    f"bg-{self.n}", rng.randint(4, 7), rng.choice([1, 2, 4, 4, 8]), team=f"t{rng.randint(0, 3)}",
                    user=f"u{rng.randint(0, 5)}", t=self.t, est_runtime_s=rng.choice([3600, 7200, 36000]),
                    ckpt_interval_s=interval, ckpt_cost_s=rng.choice([10, 60]) if interval else 0,
                    restore_cost_s=rng.choice([0, 30]),
                )
            )  # fmt: skip
        c = self.world.state.canonical
        for job_id in sorted(c.jobs):
            job = c.jobs[job_id]
            if job.state == "starting":
                self.world.feed(T.Started(t=self.t, job=job_id))
            elif job.state == "running" and job.ckpt_interval_ms and rng.random() < 0.3:
                self.world.feed(
                    T.CheckpointSaved(t=self.t, job=job_id, step=self.n, digest="sha256:" + "0" * 64, bytes=1)
                )

    def urgent(self) -> None:
        self.t += MIN
        self.n += 1
        rng = self.rng
        self.world.feed(
            submit(f"urgent-{self.n}", rng.randint(0, 2), rng.choice([1, 2, 4, 8]), team="ops", user="sre", t=self.t,
                   est_runtime_s=1800)
        )  # fmt: skip


# The release curve read exactly, and on the grid (kept across steps) of the defaults.
@pytest.mark.parametrize("grid_ms", [0, 60_000])
def test_a_bounded_search_misses_the_cheapest_set_by_no_more_than_the_gap_it_records(monkeypatch, grid_ms):
    counts: dict = {}
    for seed in range(40):
        pool = _BusyPool(seed, grid_ms)
        for _ in range(6):
            pool.fill()
            _searches_compared(pool.world, monkeypatch, counts)
            pool.urgent()
    assert counts.get("bounded", 0) > 20 and counts.get("whole", 0) > 20, counts
    assert counts.get("missed", 0) > 0, counts  # the gap is not there for nothing


def _pool_of_young_and_old_victims(budget: int) -> Run:
    """Six 8-GPU nodes, each full with two 4-GPU jobs; n5's started last."""
    run = Run(preemption_candidate_nodes_max=budget)
    names = [f"n{i}" for i in range(6)]
    run.at(0, *[node(name) for name in names])
    for i, name in enumerate(names):
        run.at(
            1000 + i * 10 * MIN,
            submit(f"{name}-a", 6, 4, team="search", user="li", est_runtime_s=20 * 3600),
            submit(f"{name}-b", 6, 4, team="search", user="li", est_runtime_s=20 * 3600),
        )
        start_all(run, 2000 + i * 10 * MIN)
    return run


def test_a_plan_past_the_budget_records_its_gap_and_a_whole_one_records_none():
    whole = _pool_of_young_and_old_victims(budget=100)
    planned = of(
        whole.at(3 * HOUR, submit("urgent", 1, 8, team="safety", user="ana", est_runtime_s=1800)),
        T.PreemptionPlanned,
    )
    assert len(planned) == 1 and planned[0].victims == ["n5-a", "n5-b"]
    assert planned[0].regret_max is msgspec.UNSET
    assert b"regret_max" not in msgspec.json.encode(planned[0])
    bounded = _pool_of_young_and_old_victims(budget=1)
    planned = of(
        bounded.at(3 * HOUR, submit("urgent", 1, 8, team="safety", user="ana", est_runtime_s=1800)),
        T.PreemptionPlanned,
    )
    # The youngest victims come up first and are the cheapest: the same set, with the gap
    # to the next node's bound recorded.
    assert len(planned) == 1 and planned[0].victims == ["n5-a", "n5-b"]
    assert planned[0].regret_max > 0
    # The job's story (`xirang audit --job`) tells the gap where there is one, only there.
    for run, told in ((bounded, True), (whole, False)):
        audit = Audit(job="urgent")
        for pos, record in enumerate(run.records, 1):
            audit.feed(pos, T.encode(record))
        audit.finish()
        assert audit.problem is None
        gap = [line for line in audit.story if "could have cost up to" in line]
        assert bool(gap) == told, audit.story


def test_a_victims_soonest_fit_elsewhere_read_from_the_fit_orders_is_the_one_every_node_gives():
    """`RequeueFit` reads where a victim fits soonest off the nodes it holds from the kept
    fit orders (the fronts): at every step of random worlds (nodes dying, cordoned, jobs
    moving), for every queued job's scope and every running job, the same wait as ranking
    every node."""
    from core.forecast.requeue_fit import RequeueFit
    from core.forecast.waits import expected_runtime_ms
    from core.passes.plan import Decline, preemption_scope

    compared = 0
    for seed in range(8):
        world = World(seed)
        for inp in world.boot():
            world.feed(inp)
        for i in range(400):
            world.feed(world.next_input())
            if i % 2:
                continue
            state = world.state
            jobs = state.canonical.jobs
            for job_id in sorted(jobs):
                job = jobs[job_id]
                if job.state != QUEUED:
                    continue
                scope = preemption_scope(state, job)
                if isinstance(scope, Decline):
                    continue
                fit = RequeueFit(state, scope.nodes, job.gpus, expected_runtime_ms(state, job))
                for victim_id in sorted(jobs):
                    victim = jobs[victim_id]
                    if victim.state != "running":
                        continue
                    own = {slot.node: len(slot.gpus) for slot in victim.placement}
                    assert fit._soonest_elsewhere(victim.gpus, own) == fit._soonest_elsewhere_ranked(
                        victim.gpus, own
                    ), (seed, i, job_id, victim_id)
                    compared += 1
    assert compared > 300, compared
