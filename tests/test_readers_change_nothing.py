"""Reading never changes the state: every reader of the core (the explanations, the
preemption plan by priority and by reclaim, the holds of the last pass, the next due time,
the fair shares, the forecasts) run on a state leaves its canonical entities and the index
`evolve` keeps exactly as they were, on random worlds at many points. What readers may
write is the scratch beside the state (caches, and the passes' memory the holds of the
last pass are worked out into)."""

from __future__ import annotations

import copy
import random

import pytest

from core import types as T
from core.explain import explain, explain_queue
from core.forecast.waits import expected_runtime_ms, natural_wait_ms
from core.machine import next_due_t
from core.model.entities import QUEUED
from core.model.placement import acceptable_models
from core.model.state import snapshot_bytes, victim_classes
from core.passes.placement import reserved_nodes
from core.passes.plan import plan_preemption, preemption_scope
from core.rules.shares import fair_shares, holding, teams_below_share
from random_world import World
from test_explain_agrees_with_decision import random_policy


def frozen(state) -> tuple:
    """What a reader must leave as it was: the canonical entities' bytes and every lookup of
    the index (the victim classes as a reader finds them: the jobs touched since they were
    last read keyed again, as the first read does)."""
    victim_classes(state)
    return snapshot_bytes(state.canonical), state.canonical.t, copy.deepcopy(vars(state.index))


def read_everything(state) -> None:
    explain_queue(state)
    reserved_nodes(state)
    next_due_t(state)
    fair_shares(state)
    holding(state)
    teams_below_share(state)
    for job_id in sorted(state.canonical.jobs):
        job = state.canonical.jobs[job_id]
        if job.state != QUEUED:
            continue
        explain(state, job_id)
        for reclaim in (False, True):
            plan_preemption(state, job, reclaim=reclaim, diagnose=True)
            plan_preemption(state, job, reclaim=reclaim, known_decline="benefit_below_cost")
        preemption_scope(state, job)
        expected_runtime_ms(state, job)
        models = acceptable_models(job.gpu_models, state.index)
        nodes = [n for n in state.canonical.nodes.values() if n.up and n.gpu_model in models]
        natural_wait_ms(state, job, nodes)


@pytest.mark.parametrize("seed", range(12))
def test_every_reader_leaves_the_state_as_it_was(seed: int):
    rng = random.Random(seed)
    world = World(seed)
    for inp in world.boot():
        world.feed(inp)
    world.feed(T.SetPolicy(t=0, params=random_policy(rng)))
    read = 0
    for step in range(400):
        world.feed(world.next_input())
        if step % 20:
            continue
        before = frozen(world.state)
        read_everything(world.state)
        assert frozen(world.state) == before, (seed, step)
        read += 1
    assert read
