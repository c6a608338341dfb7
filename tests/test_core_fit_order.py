"""The kept fit orders (core/forecast/fit_order.py) give exactly the earliest single-node fit
that reading every node's forecast gives, step after step of random worlds: nodes joining,
dying and cordoned, jobs starting, checkpointing, overrunning and ending, learned runtimes
moving."""

from __future__ import annotations

import random

from core.forecast.fit_order import ordered_single_fit
from core.forecast.node_fit import earliest_single_fit
from core.forecast.requeue_fit import RequeueFit
from core.model.entities import HOLDING
from core.model.up_nodes import UpNodes
from tests.random_world import World
from tests.test_core_node_cordon import CordoningWorld


def check_fits(state, rng: random.Random) -> int:
    """Compare the kept order with the full read for every model and gang size, some nodes
    held out; the number of comparisons that found a fit."""
    found = 0
    ix = state.index
    for model in sorted(ix.up_nodes_by_model):
        names = ix.up_nodes_by_model[model]
        excluded = [name for name in names if rng.random() < 0.2]
        for need in range(1, 9):
            if rng.random() < 0.3:
                continue  # an order left unread a while catches up when next read
            nodes = UpNodes(state, [model], excluded)
            listed = [state.canonical.nodes[name] for name in names if name not in excluded]
            answered, ordered = ordered_single_fit(state, nodes, need)
            if not answered:
                continue
            scanned = (
                earliest_single_fit(state, listed, need)
                if need <= max((n.gpus for n in listed), default=0)
                else None
            )
            assert ordered == scanned, (state.canonical.t, model, need, excluded, ordered, scanned)
            found += ordered is not None
    return found


def test_kept_fit_orders_give_the_earliest_fit_of_every_node_at_every_step():
    found = 0
    for seed in range(8):
        world = World(seed) if seed % 2 else CordoningWorld(seed)  # nodes cordoned now and then
        rng = random.Random(seed)
        for inp in world.boot():
            world.feed(inp)
        for _ in range(700):
            world.feed(world.next_input())
            found += check_fits(world.state, rng)
    assert found > 1000, "too few fits compared to mean anything"


def check_requeue_waits(state, rng: random.Random) -> int:
    """A victim's wait to fit again after a preemption (`RequeueFit`) over the up nodes read
    from the kept orders equals the one over the same nodes listed; the number compared."""
    compared = 0
    ix = state.index
    jobs = state.canonical.jobs
    holding = [job_id for job_id in sorted(jobs) if jobs[job_id].state in HOLDING]
    for model in sorted(ix.up_nodes_by_model):
        names = ix.up_nodes_by_model[model]
        held = [name for name in names if rng.random() < 0.2]
        listed = [state.canonical.nodes[name] for name in names if name not in held]
        gpus, runtime = rng.choice([1, 2, 4, 8]), rng.choice([60_000, 3_600_000])
        kept = RequeueFit(state, UpNodes(state, [model], held), gpus, runtime)
        plain = RequeueFit(state, listed, gpus, runtime)
        for job_id in rng.sample(holding, min(3, len(holding))):
            victim = jobs[job_id]
            at_least = rng.choice([0, 0, 600_000])
            assert kept.wait_ms(victim, at_least) == plain.wait_ms(victim, at_least), (job_id, model, held)
            compared += 1
    return compared


def test_a_victims_wait_to_fit_again_is_the_same_read_from_the_kept_orders():
    compared = 0
    for seed in range(6):
        world = World(seed) if seed % 2 else CordoningWorld(seed)
        rng = random.Random(seed)
        for inp in world.boot():
            world.feed(inp)
        for _ in range(500):
            world.feed(world.next_input())
            compared += check_requeue_waits(world.state, rng)
    assert compared > 1000
