"""The kept fit orders (core/forecast/fit_order.py) give exactly the earliest single-node fit
that reading every node's forecast gives, step after step of random worlds: nodes joining,
dying and cordoned, jobs starting, checkpointing, overrunning and ending, learned runtimes
moving."""

from __future__ import annotations

import random

from core.forecast.fit_order import ordered_single_fit
from core.forecast.node_fit import earliest_single_fit
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
