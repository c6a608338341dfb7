"""Whether a preemption is worth it (core/rules/benefit.py), as a table, and the lazy
choice's shortcut (`priced_out_at`) against the rule (`worth`) on random sets: a set priced
at the shortcut's threshold or more is always declined by the rule."""

from __future__ import annotations

import random

import msgspec
import pytest

from core.model.policy import Policy
from core.model.entities import Job
from core.rules.benefit import BELOW_COST, priced_out_at, worth
from core.rules.pricing import Pricing, VictimCost


def job(level: int, gpus: int = 8, queued_since_t: int = 0) -> Job:
    return Job(
        id="p", team="t", user="u", kind="job", level=level, requested_level=level, eff_level=level,
        gpus=gpus, gpu_models=[], est_runtime_ms=1, ckpt_interval_ms=0, ckpt_cost_ms=0, restore_cost_ms=0,
        preemptible=True, queued_since_t=queued_since_t,
    )  # fmt: skip


def cost(value: float, ready_ms: int, lost: float = 0.0) -> VictimCost:
    return VictimCost(
        job="v", gpus=1, lost_ms=0, save_ms=0, restore_ms=0, requeue_wait_ms=0, ready_ms=ready_ms,
        checkpoint_needed=False, cost=value, lost_cost=lost,
    )  # fmt: skip


P = Policy()
W3 = P.level_weight[3]

# (preemptor level, natural wait ms, victims' (cost, ready ms), net_benefit_min, refused?)
CASES = [
    (3, 600_000, [(100.0, 60_000)], 0.0, False),  # 540 s saved on 8 GPUs at level 3
    (3, 60_000, [(100.0, 60_000)], 0.0, True),  # they let go when it would have started anyway
    (3, 600_000, [(W3 * 8 * 540, 60_000)], 0.0, True),  # benefit equal to cost: declined
    (3, 600_000, [(W3 * 8 * 540 - 1, 60_000)], 0.0, False),
    (3, 600_000, [(W3 * 8 * 540 - 1, 60_000)], 10.0, True),  # not by more than net_benefit_min
    (3, 600_000, [(1.0, 60_000), (1.0, 700_000)], 0.0, True),  # the slowest victim counts
]


@pytest.mark.parametrize(("level", "natural", "victims", "net_min", "refused"), CASES)
def test_worth_table(level, natural, victims, net_min, refused):
    p = msgspec.structs.replace(P, net_benefit_min=net_min)
    refusal, benefit, total, ready = worth(p, job(level), 0, [cost(c, r) for c, r in victims], natural)
    assert (refusal == BELOW_COST) is refused
    assert ready == max(r for _, r in victims) and total == pytest.approx(sum(c for c, _ in victims))


def test_an_urgent_job_past_its_target_is_worth_more():
    p = P
    late = job(1, queued_since_t=-10 * p.urgent_wait_target_s * 1000)
    costs = [cost(10.0**7, 10_000)]  # a disruption that does not cap the premium
    assert worth(p, late, 0, costs, 60_000)[1] > worth(p, job(1), 0, costs, 60_000)[1]


def test_no_threshold_at_the_urgent_levels_or_with_a_negative_net_benefit_min():
    pricing = Pricing(
        wasted_weight_min=1.0, waiting_weight=0.1, preemptor_gpus=8, safe_point_ms=0, displaced_max_ms=0
    )
    assert priced_out_at(job(1), P, pricing, 60_000) is None
    assert priced_out_at(job(3), msgspec.structs.replace(P, net_benefit_min=-1.0), pricing, 60_000) is None


def test_a_set_priced_at_the_threshold_or_more_is_declined_by_the_rule():
    rng = random.Random(3)
    for _ in range(20_000):
        level = rng.randint(P.urgent_levels, 7)
        gpus = rng.choice([1, 2, 4, 8, 16])
        p = msgspec.structs.replace(P, net_benefit_min=rng.choice([0.0, 0.5, 100.0]))
        preemptor = job(level, gpus)
        waiting_weight = p.level_weight[level] * gpus / 1000.0
        pricing = Pricing(
            wasted_weight_min=1.0, waiting_weight=waiting_weight, preemptor_gpus=gpus, safe_point_ms=0,
            displaced_max_ms=0,
        )  # fmt: skip
        natural = rng.choice([0, 1000, rng.randint(0, 10**8)])
        threshold = priced_out_at(preemptor, p, pricing, natural)
        costs = [
            cost(rng.uniform(0, 10**6) * rng.random() ** 4, rng.randint(0, 10**8))
            for _ in range(rng.randint(1, 4))
        ]
        price = sum(c.cost for c in costs) + waiting_weight * max(c.ready_ms for c in costs)
        if price >= threshold:
            assert worth(p, preemptor, 0, costs, natural)[0] == BELOW_COST, (price, threshold)
