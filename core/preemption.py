"""The preemption decision model, one concept per module; this module names its public
parts in one place:

- `core.forecast`: expected runtimes, releases, natural waits, safe-point latency;
- `core.eligibility`: who may preempt, who may be a victim;
- `core.fairness`: the team and user limits and the `Guard` on a victim set;
- `core.pricing`: what each victim costs;
- `core.victims`: the cheapest minimal victim set;
- `core.plan`: `plan_preemption`, eligible -> price -> choose -> judge.
"""

from __future__ import annotations

from .eligibility import (
    eligible_victims,
    may_preempt,
    reclaim_victim_eligible,
    user_preempting_exhausted,
    victim_eligible,
    victim_preemptible_now,
)
from .fairness import Guard, scaled_limit, team_limit
from .forecast import (
    ReleaseCurve,
    earliest_fit,
    expected_runtime_ms,
    natural_wait_ms,
    node_releases,
    remaining_ms,
    safe_point_ms,
)
from .plan import Decline, Plan, plan_preemption, variant_policy
from .pricing import Pricing, VictimCost, queue_pressure, requeue_level, victim_cost
from .victims import choose_victims

__all__ = [
    "Decline",
    "Guard",
    "Plan",
    "Pricing",
    "ReleaseCurve",
    "VictimCost",
    "choose_victims",
    "earliest_fit",
    "eligible_victims",
    "expected_runtime_ms",
    "may_preempt",
    "natural_wait_ms",
    "node_releases",
    "plan_preemption",
    "queue_pressure",
    "reclaim_victim_eligible",
    "remaining_ms",
    "requeue_level",
    "safe_point_ms",
    "scaled_limit",
    "team_limit",
    "user_preempting_exhausted",
    "variant_policy",
    "victim_cost",
    "victim_eligible",
    "victim_preemptible_now",
]
