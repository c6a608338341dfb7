"""Who may be a victim (core/rules/eligibility.py): a table of the first rule that refuses a
victim, and the decision's shortcut (`eligible_victims`, which walks only the levels in
reach) against the rule (`victim_refusal` over every job holding GPUs) on random worlds
under random policies, for every queued job, by priority and by reclaim."""

from __future__ import annotations

import random

import msgspec
import pytest

from core import types as T
from core.model.entities import QUEUED
from core.model.placement import acceptable_models
from core.rules.decision import Decision
from core.rules.eligibility import (
    HELD_NODE,
    NAMED_FIRST,
    OTHER_MODEL,
    eligible_victims,
    first_refusal,
    less_urgent_holders,
    victim_refusal,
)
from core.rules.guarantees import Guard
from random_world import World
from scenario import HOUR, Run, node, start_all, submit
from test_explain_agrees_with_decision import random_policy


def running_victim(**policy):
    run = Run(**policy)
    run.at(0, node("a1"), node("h1", model="H100"))
    run.at(1000, submit("victim", 6, 8, team="v", user="v", est_runtime_s=36000))
    start_all(run, 2000)
    run.state.canonical.t = HOUR
    return run.state


# (preemptor level, its user, accepted models, nodes held for others, refusal)
@pytest.mark.parametrize(
    ("level", "user", "models", "held", "refusal"),
    [
        (1, "p", ["A100"], {}, ""),
        (6, "p", ["A100"], {}, "own_or_more_urgent_level"),
        (5, "p", ["A100"], {}, "preempts_from_level"),
        (1, "p", ["H100"], {}, OTHER_MODEL),
        (1, "p", ["A100"], {"a1": 0}, HELD_NODE),
    ],
)
def test_victim_refusal_table(level, user, models, held, refusal):
    state = running_victim()
    victim = state.canonical.jobs["victim"]
    preemptor = msgspec.structs.replace(victim, id="p", level=level, user=user, team="p", state=QUEUED)
    d = Decision(state, preemptor)
    assert (
        victim_refusal(d, Guard(state, preemptor, d.policy), victim, dict.fromkeys(models), held) == refusal
    )


def test_the_fairness_limits_are_named_before_what_frees_up_on_its_own():
    assert first_refusal({"busy": ["x"], "team_preempted_max": ["y"]}) == ("team_preempted_max", ["y"])
    assert first_refusal({}) == ("", [])
    assert NAMED_FIRST.index("preemption_levels_down_max") < NAMED_FIRST.index("busy")


@pytest.mark.parametrize("chunk", range(4))
def test_eligible_victims_are_exactly_those_no_rule_refuses(chunk):
    assert sum(compare_on_world(seed) for seed in range(chunk, 40, 4)) > 0


def compare_on_world(seed: int) -> int:
    rng = random.Random(seed)
    world = World(seed)
    for inp in world.boot():
        world.feed(inp)
    world.feed(T.SetPolicy(t=0, params=random_policy(rng)))
    compared = 0
    for step in range(300):
        world.feed(world.next_input())
        if step % 10:
            continue
        state = world.state
        nodes = sorted(state.canonical.nodes)
        for job in [j for j in state.canonical.jobs.values() if j.state == QUEUED]:
            for reclaim in (False, True):
                d = Decision(state, job, reclaim)
                guard = Guard(state, job, d.policy)
                models = acceptable_models(job.gpu_models, state.index)
                held = {name: 0 for name in nodes if rng.random() < 0.2}
                fast = [v.id for v in eligible_victims(d, guard, models, held)]
                ok = dict.fromkeys(models)
                by_rule = [
                    v.id
                    for v in less_urgent_holders(state, job, True)
                    if v.level > (-1 if reclaim else job.level) and not victim_refusal(d, guard, v, ok, held)
                ]
                assert fast == by_rule, (seed, job.id, reclaim)
                compared += 1
    return compared
