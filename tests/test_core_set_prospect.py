"""Before it prices a victim, the plan for a job that fits one node asks whether a set may
exist at all (core/passes/bounded.py `set_prospect`, read from the victims' side and ending
at the first node where one may): its verdict is the one the list of every eligible victim
gives (`eligible_victims` empty: no eligible victim; `cannot_free_enough` over them: no set
within the limits), for every queued job that may preempt, on busy pools where urgent jobs
arrive (half of them under level and team guarantees) and at every step of random worlds."""

from __future__ import annotations

import random

from core.model.entities import QUEUED
from core.model.placement import node_size_max
from core.passes.bounded import MAY_FIND, NO_ELIGIBLE, NO_SET, set_prospect
from core.passes.plan import Decline, preemption_scope
from core.passes.victims import SetSearch, cannot_free_enough
from core.rules.decision import Decision
from core.rules.eligibility import eligible_victims
from core.rules.guarantees import Guard
from core.rules.holds import victim_cap
from core.rules.rights import may_preempt
from core.rules.substitutes import substitutes
from random_world import World
from scenario import Run, node
from test_core_bounded_search import _BusyPool

# Guarantees that refuse victims: each bottom level keeps a share of the pool, and teams
# holding no more than their fair share are shielded from the levels it covers.
GUARDED = {"guaranteed_share": [0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.1], "fair_share_guarantee": True}


class _GuardedPool(_BusyPool):
    """`_BusyPool` under `GUARDED`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.world = World(seed)
        self.t = 0
        self.n = 0
        self.world.state = Run(**GUARDED).state
        for i in range(self.rng.randint(6, 12)):
            self.world.feed(node(f"n{i:02d}", t=0))


def _verdicts_compared(state, counts: dict) -> None:
    p = state.canonical.policy
    jobs = state.canonical.jobs
    for job_id in sorted(jobs):
        job = jobs[job_id]
        if job.state != QUEUED or not may_preempt(p, job.level) or substitutes(p, job):
            continue
        scope = preemption_scope(state, job)
        if isinstance(scope, Decline) or job.gpus > node_size_max(scope.models, state.index):
            continue
        d = Decision(state, job, False)
        guard = Guard(state, job, p)
        search = SetSearch(state, job, guard, victim_cap(state, p, job, scope.models))
        eligible = eligible_victims(d, guard, scope.models, scope.held)
        if not eligible:
            expected = NO_ELIGIBLE
        elif cannot_free_enough(search, scope.models, scope.nodes, eligible):
            expected = NO_SET
        else:
            expected = MAY_FIND
        assert set_prospect(d, search, scope.models, scope.held) == expected, (job_id, expected)
        counts[expected] = counts.get(expected, 0) + 1


def test_the_prospect_of_a_victim_set_is_the_one_every_eligible_victim_gives():
    counts: dict = {}
    for seed in range(40):
        pool = _GuardedPool(seed) if seed % 2 else _BusyPool(seed, 0)
        for _ in range(5):
            pool.fill()
            _verdicts_compared(pool.world.state, counts)
            pool.urgent()
            _verdicts_compared(pool.world.state, counts)
    for seed in range(4):
        world = World(seed)
        for inp in world.boot():
            world.feed(inp)
        for i in range(300):
            world.feed(world.next_input())
            if i % 3 == 0:
                _verdicts_compared(world.state, counts)
    # Each verdict is met often enough for the comparison to mean something.
    assert min(counts.get(v, 0) for v in (NO_ELIGIBLE, NO_SET, MAY_FIND)) > 10, counts
