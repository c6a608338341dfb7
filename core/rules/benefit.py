"""Whether a preemption is worth it: the preemptor's weighted wait saved (its natural wait
less the time the slowest victim takes to let go, GPU-seconds at its level's weight, plus
for an urgent job past or forecast past its wait target the overdue premium,
`core.rules.pricing.overdue_premium`) against the victim set's cost; it is made only when
benefit - cost exceeds `net_benefit_min`.

`worth` is the rule. `priced_out_at` is its shortcut for the lazy choice of victims: a set
price at which `worth` is sure to decline (tests/test_benefit.py compares them on random
sets; the margin that keeps them on the same side is explained there).
"""

from __future__ import annotations

from ..model.policy import Policy
from ..model.entities import Job
from .pricing import Pricing, VictimCost, overdue_premium

BELOW_COST = "benefit_below_cost"
NET_BENEFIT_MIN = "net_benefit_min"


def worth(
    p: Policy, job: Job, t: int, costs: list[VictimCost], natural_wait: int, substitute_cost: float = 0.0
) -> tuple[str, float, float, int]:
    """(refusal, benefit, cost, ready_ms) of a preemption for `job` taking victims of
    `costs`: refusal is "" when it is worth making, else `BELOW_COST`; ready_ms is when the
    slowest victim has let go."""
    cost = sum(c.cost for c in costs) + substitute_cost
    ready = max(c.ready_ms for c in costs)
    benefit = p.level_weight[job.level] * job.gpus * max(0, natural_wait - ready) / 1000.0
    benefit += overdue_premium(p, job, t, natural_wait, ready, costs)
    refusal = BELOW_COST if benefit - cost <= p.net_benefit_min else ""
    return refusal, benefit, cost, ready


def priced_out_at(job: Job, p: Policy, pricing: Pricing, natural_wait: int) -> float | None:
    """The `set_price` (core.passes.victims) at or above which `worth` is sure to decline a
    set, or None where no such price is sure. Below the urgent levels (no overdue premium)
    a set's benefit less its cost is the preemptor's weighted natural wait less the set's
    price (its costs and the weighted wait for its slowest release), or, when the victims
    let go after the natural wait, minus its costs (no more than zero); so with
    `net_benefit_min` >= 0 a set priced at the weighted natural wait less `net_benefit_min`
    or more is declined. A margin keeps the floating-point sums of `worth` on the same
    side."""
    if job.level < p.urgent_levels or p.net_benefit_min < 0:
        return None
    ceiling = pricing.waiting_weight * natural_wait
    return ceiling - p.net_benefit_min + 1e-6 * max(1.0, abs(ceiling), abs(p.net_benefit_min))


def describe(p: Policy, benefit: float, cost: float) -> str:
    """The sentence for a preemption declined as not worth it."""
    return (
        f"the wait it would save is worth {benefit:.0f}, the victims' loss {cost:.0f}"
        f" (net_benefit_min {p.net_benefit_min:g})"
    )
