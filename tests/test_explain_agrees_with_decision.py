"""The reason a waiting job is told (`core.explain`, what `xirang jobs` shows) is the one the
preemption decision recorded, or would record: on 10,000 random worlds under random
policies, for every job whose decline the step's last event recorded, the explanation
carries that decline; and for every queued job that may preempt or reclaim, the rule it
names is one that really refuses what it names (no eligible victim: every job it could take
is refused by some rule, and those named by the one it names)."""

from __future__ import annotations

import random

import pytest

from core import types as T
from core.explain import explain
from core.model.entities import QUEUED
from core.passes.plan import Decline, Scope, plan_preemption, preemption_scope
from core.rules.decision import Decision
from core.rules.eligibility import less_urgent_holders, victim_refusal
from core.rules.guarantees import Guard
from core.rules.rights import may_preempt
from core.rules.substitutes import substitutes
from random_world import World

WORLDS = 10_000
STEPS = 60
CHUNKS = 20  # the worlds are split in this many tests, so that workers share them


def random_policy(rng: random.Random) -> dict:
    """Policies that exercise every rule an explanation may name."""
    first = [rng.randint(level + 1, 8) if rng.random() < 0.5 else min(8, level + 1) for level in range(8)]
    share = rng.choice([0.0, 0.0, 0.1, 0.25])
    return {
        "preempts_from_level": first,
        "preemption_levels_down_max": rng.choice([1, 2, 3, 7]),
        "preemption_depth_max": rng.choice([1, 2]),
        "victims_per_preemption_max": rng.randint(1, 8),
        "fair_share_guarantee": rng.random() < 0.4,
        "fair_share_from_level": rng.randint(2, 6),
        "user_preempted_max": rng.randint(0, 3),
        "team_preempted_max": rng.randint(0, 3),
        "user_preempting_max": rng.randint(0, 3),
        "restart_protect_from_urgent": rng.random() < 0.5,
        "guaranteed_share": [0.0] * 5 + [share, 0.0, 0.0],
    }


def check_world(seed: int) -> int:
    """Run one world, checking after every step; the number of declines compared."""
    rng = random.Random(seed)
    world = World(seed)
    for inp in world.boot():
        world.feed(inp)
    world.feed(T.SetPolicy(t=0, params=random_policy(rng)))
    compared = 0
    for _ in range(STEPS):
        records = world.feed(world.next_input())
        if records and isinstance(records[-1].event, T.PreemptionDeclined):
            declined = records[-1].event
            job = world.state.canonical.jobs[declined.job]
            if job.state == QUEUED:
                why = explain(world.state, declined.job)
                assert why.decline == declined.reason, (seed, declined, why)
                compared += 1
    for job_id in sorted(world.state.canonical.jobs):
        job = world.state.canonical.jobs[job_id]
        if job.state == QUEUED:
            check_named_rule(world, job, seed)
    return compared


def check_named_rule(world: World, job, seed: int) -> None:
    state = world.state
    why = explain(state, job.id)
    if not why.decline:
        return
    reclaim = not may_preempt(state.canonical.policy, job.level)
    decided = plan_preemption(state, job, reclaim=reclaim, diagnose=True)
    assert isinstance(decided, Decline) and decided.reason == why.decline, (seed, job.id, decided, why)
    if why.code in ("gang_too_large", "no_node_of_model"):
        return  # it cannot start whatever is preempted: that is what it is told
    assert why.limit == decided.limit, (seed, job.id, decided, why)
    scope = preemption_scope(state, job)
    if why.decline == "no_eligible_victims" and isinstance(scope, Scope):
        d = Decision(state, job, reclaim)
        guard = Guard(state, job, d.policy)
        models = dict.fromkeys(scope.models + list(substitutes(d.policy, job)))
        for victim in less_urgent_holders(state, job, reclaim):
            # every job it could take is refused by some rule
            assert victim_refusal(d, guard, victim, models, scope.held), (seed, job.id, victim.id)
        for blocked in decided.blocked:
            victim = state.canonical.jobs[blocked]
            assert victim_refusal(d, guard, victim, models, scope.held) == why.limit, (seed, job.id, blocked)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_explanation_gives_the_reason_the_decision_records(chunk: int):
    compared = sum(check_world(seed) for seed in range(chunk, WORLDS, CHUNKS))
    assert compared > 0
