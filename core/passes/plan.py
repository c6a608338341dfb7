"""The preemption plan for one blocked job, in four steps:

1. eligible (`core.rules.eligibility`): the running jobs it may displace, on nodes of a GPU
   model it accepts, within the fairness limits (`core.rules.fairness`);
2. price (`core.rules.pricing`): each victim's cost (displacement and wasted work, letting go
   the cheaper way), against the preemptor's natural wait (`core.forecast.waits`);
3. choose (`core.passes.victims`): the cheapest minimal victim set that frees a gang placement;
4. judge: the benefit (the preemptor's wait saved, in GPU-seconds weighted by its level,
   minus the time the victims take to let go) against the set's cost: preempt only when
   benefit - cost > policy.net_benefit_min.

A reclaim (`plan_preemption(..., reclaim=True)`) is the same decision for a job whose team
is below its fair share, over other teams' jobs held above theirs (see core/rules/shares.py).
Reads the state; writes only the index's memo caches.
"""

from __future__ import annotations

import msgspec

from ..rules.eligibility import eligible_victims, user_preempting_exhausted
from ..rules.fairness import Guard, depth_limits
from ..forecast.waits import ReleaseCurve, RequeueFit, expected_runtime_ms, natural_wait_ms
from ..model.placement import acceptable_models, node_size_max, place
from .placement import reserved_nodes
from ..rules.holds import binding_holds, victim_cap
from ..model.policy import Policy, with_params
from ..rules.pricing import LazyPrices, VictimCost, overdue_premium, price_victims, pricing_for
from ..model.state import QUEUED, Job, Node, State, nodes_by_name
from ..model.types import Slot
from ..rules.substitutes import substitute_penalty, substitutes
from .victims import NegativeCost, cannot_free_enough, choose_on_one_node_lazily, choose_victims


class Plan(msgspec.Struct, kw_only=True):
    """A preemption worth making: the victims, the preemptor's placement, benefit and cost,
    when the victims should have let go, and which must save first."""

    victims: list[str]
    placement: list[Slot]
    benefit: float
    cost: float
    ready_ms: int
    natural_wait_ms: int
    checkpoint_needed: dict[str, bool]
    reason: str
    reclaim: bool = False
    depth: int = 1  # the cascade's depth (see core.model.policy: preemption_depth_max)
    levels_down: int = 0  # how far below the preemptor its lowest victim is


class Decline(msgspec.Struct, kw_only=True):
    """Why no preemption is made for a job now (a reason code; benefit and cost when it was
    priced)."""

    reason: str
    benefit: float = 0.0
    cost: float = 0.0


class Scope(msgspec.Struct, kw_only=True):
    """Where a preemption for the job may free GPUs: its models, their up nodes not held for
    other blocked jobs, the nodes held (node -> expected start), and its expected runtime."""

    models: list[str]
    nodes: list[Node]
    held: dict[str, int]
    runtime_ms: int


def plan_preemption(state: State, job: Job, reclaim: bool = False, known_decline: str = "") -> Plan | Decline:
    """Victims for a blocked job by priority or, with `reclaim`, by its team's fair share:
    then the victims are other teams' jobs above their shares, of any level from
    `fair_share_from_level` on, and they are charged the work wasted but no displacement (the
    GPUs they give back were the reclaiming team's share, lent while it did not ask).
    `known_decline`: a decline the caller would record nothing for (the job's last one);
    when sure of a `benefit_below_cost` decline, the plan may return it without its
    benefit and cost (`_priced_out_at`)."""
    # A user past the allowance may still displace their own jobs: the limit counts only
    # preemptions of others' work.
    own_only = user_preempting_exhausted(state, job)
    if own_only and reclaim:
        return Decline(reason="user_preempting_limit")
    p = variant_policy(state, job)
    if job.cascade_depth + 1 > depth_limits(p, job)[0]:
        # Displaced by a cascade already as deep as its team or user may go: it waits.
        return Decline(reason="preemption_depth_limit")
    guard = Guard(state, job, p)
    if reclaim and not guard.below_share_with(job):
        return Decline(reason="reclaim_beyond_share")
    scope = preemption_scope(state, job)
    if isinstance(scope, Decline):
        return scope
    stand_ins = substitutes(p, job)
    eligible = eligible_victims(
        state, job, p, guard, scope.models + list(stand_ins), scope.held, reclaim, own_only
    )
    if not eligible:
        return Decline(reason="user_preempting_limit" if own_only else "no_eligible_victims")
    if not stand_ins and cannot_free_enough(
        state, job, scope.models, scope.nodes, eligible, guard, victim_cap(state, p, job, scope.models)
    ):
        return Decline(reason="no_victim_set_within_limits")  # whatever the prices: skip them
    curve = ReleaseCurve(state, scope.nodes, scope.runtime_ms)
    natural_wait = natural_wait_ms(state, job, scope.nodes, curve)
    pricing = pricing_for(state, job, p, scope.runtime_ms, natural_wait)
    if reclaim:
        costs = price_victims(state, job, eligible, p, pricing, curve, None)
        choice, penalty = _choose_with_substitutes(state, job, p, scope, stand_ins, costs, pricing, guard)
    else:
        fit = RequeueFit(state, scope.nodes, job.gpus, scope.runtime_ms)
        priced = _choose_priced(
            state, job, p, scope, stand_ins, eligible, pricing, curve, fit, guard, natural_wait, known_decline
        )
        if isinstance(priced, Decline):
            return priced
        choice, penalty, costs = priced
    if choice is None:
        return Decline(reason="no_victim_set_within_limits")
    victims, placement = choice
    if not victims:  # it fits on GPUs held for a starving job: it waits like everyone else
        return Decline(reason="held_back_by_reservation")
    return judge(state, job, p, guard, costs, victims, placement, natural_wait, reclaim, penalty)


def _choose_priced(
    state, job, p, scope, stand_ins, eligible, pricing, curve, fit, guard, natural_wait, known_decline
):
    """(choice, substitute's extra cost, the victims' costs): for a job that fits one node
    on its own models, victims priced exactly only where their set could win
    (`choose_on_one_node_lazily`), and only until the decline is sure when it is known
    (`_priced_out_at`: then the Decline); else every eligible victim priced."""
    prices = LazyPrices(state, job, eligible, p, pricing, curve, fit)
    if not stand_ins and job.gpus <= node_size_max(scope.models, state.index):
        try:
            cap = victim_cap(state, p, job, scope.models)
            priced_out_at = (
                _priced_out_at(job, p, pricing, natural_wait) if known_decline == BELOW_COST else None
            )
            choice = choose_on_one_node_lazily(
                state, job, scope.nodes, prices, pricing, guard, cap, priced_out_at=priced_out_at
            )
            if isinstance(choice, str):  # victims.PRICED_OUT
                return Decline(reason=BELOW_COST)
            return choice, 0.0, prices.exact_costs()
        except NegativeCost:
            pass
    costs = {victim.id: prices.exact(victim.id) for victim in eligible}
    choice, penalty = _choose_with_substitutes(state, job, p, scope, stand_ins, costs, pricing, guard)
    return choice, penalty, costs


BELOW_COST = "benefit_below_cost"


def _priced_out_at(job: Job, p: Policy, pricing, natural_wait: int) -> float | None:
    """The `set_price` at or above which `judge` is sure to decline a set (`benefit_below_cost`),
    or None where no such price is sure. Below the urgent levels (no overdue premium) a set's
    benefit less its cost is the preemptor's weighted natural wait less the set's price (its
    costs and the weighted wait for its slowest release), or, when the victims let go after
    the natural wait, minus its costs (no more than zero); so with `net_benefit_min` >= 0 a
    set priced at the weighted natural wait less `net_benefit_min` or more is declined. A
    margin keeps the floating-point sums of `judge` on the same side."""
    if job.level < p.urgent_levels or p.net_benefit_min < 0:
        return None
    ceiling = pricing.waiting_weight * natural_wait
    return ceiling - p.net_benefit_min + 1e-6 * max(1.0, abs(ceiling), abs(p.net_benefit_min))


def _choose_with_substitutes(
    state: State,
    job: Job,
    p: Policy,
    scope: "Scope",
    stand_ins: dict[str, float],
    costs: dict[str, VictimCost],
    pricing,
    guard: Guard,
):
    """The cheapest victim set on the job's own models or, priced with the extra run time
    (core/rules/substitutes.py), on a compatible model; (choice, that extra cost)."""
    cap = victim_cap(state, p, job, scope.models)
    if not stand_ins:
        return choose_victims(state, job, scope.models, scope.nodes, costs, pricing, guard, cap), 0.0
    c = state.canonical
    nodes_of = {
        model: [
            c.nodes[name]
            for name in sorted(c.nodes)
            if c.nodes[name].up and c.nodes[name].gpu_model == model and name not in scope.held
        ]
        for model in stand_ins
    }
    best = None
    groups = [(scope.models, scope.nodes, 0.0)] + [([m], nodes_of[m], stand_ins[m]) for m in stand_ins]
    for models, nodes, slowdown in groups:
        if not nodes:
            continue
        choice = choose_victims(state, job, models, nodes, costs, pricing, guard, cap)
        if choice is None:
            continue
        penalty = substitute_penalty(p, job, scope.runtime_ms, slowdown) if slowdown else 0.0
        key = (sum(costs[v].cost for v in choice[0]) + penalty, models)
        if best is None or key < best[0]:
            best = (key, choice, penalty)
    return (None, 0.0) if best is None else (best[1], best[2])


def preemption_scope(state: State, job: Job) -> Scope | Decline:
    """The nodes a preemption may free GPUs on, or why there are none (no node of the job's
    models; it fits without preempting; only nodes held for others)."""
    c = state.canonical
    ix = state.index
    models = acceptable_models(job.gpu_models, ix)
    nodes = [node for _, node in nodes_by_name(state) if node.up and node.gpu_model in models]
    if not nodes:
        return Decline(reason="no_node_of_model")
    runtime = expected_runtime_ms(state, job)
    # Nodes held for other blocked jobs are promised: they neither end this job's wait nor
    # can be freed for it, unless it would be done before the holder is expected to start.
    # (The reservations are from the last placement pass: skip those whose job has left
    # the queue since.)
    held = {
        name: start_t
        for name, (start_t, holder) in binding_holds(state, job, reserved_nodes(state)).items()
        if holder != job.id and c.t + runtime > start_t and _still_queued(c, holder)
    }
    if place(job.gpus, models, c.nodes, ix, held, c.t + runtime) is not None:
        # Held back only by the scan budget: no one needs to go.
        return Decline(reason="fits_without_preemption")
    if held:
        nodes = [node for node in nodes if node.name not in held]
        if not nodes:
            return Decline(reason="held_back_by_reservation")
    return Scope(models=models, nodes=nodes, held=held, runtime_ms=runtime)


def judge(
    state: State,
    job: Job,
    p: Policy,
    guard: Guard,
    costs: dict[str, VictimCost],
    victims: list[str],
    placement: list[Slot],
    natural_wait: int,
    reclaim: bool,
    substitute_cost: float = 0.0,
) -> Plan | Decline:
    """Preempt only when the preemptor's weighted wait saved exceeds the set's cost by more
    than `net_benefit_min`; the wait saved is its natural wait less the time the slowest
    victim takes to let go, and for an urgent job past (or forecast past) its wait target
    the overdue premium on top (`core.rules.pricing.overdue_premium`)."""
    cost = sum(costs[v].cost for v in victims) + substitute_cost
    ready = max(costs[v].ready_ms for v in victims)
    level_weight = p.level_weight[job.level]
    benefit = level_weight * job.gpus * max(0, natural_wait - ready) / 1000.0
    benefit += overdue_premium(p, job, state.canonical.t, natural_wait, ready, [costs[v] for v in victims])
    if benefit - cost <= p.net_benefit_min:
        return Decline(reason="benefit_below_cost", benefit=round(benefit, 3), cost=round(cost, 3))
    reason = (
        f"saves {natural_wait - ready} ms of level-{job.level} wait on {job.gpus} GPUs;"
        f" victims lose {sum(costs[v].lost_ms for v in victims)} ms of progress"
    )
    if substitute_cost:
        reason += f"; on a compatible GPU model, priced {substitute_cost:.0f} for the longer run"
    if reclaim:
        reason = (
            f"reclaim: team {job.team} holds {guard.held.get(job.team, 0)} of its fair share"
            f" {guard.shares[job.team]:.1f} GPUs; {reason}"
        )
    return Plan(
        victims=victims,
        placement=placement,
        benefit=round(benefit, 3),
        cost=round(cost, 3),
        ready_ms=ready,
        natural_wait_ms=natural_wait,
        checkpoint_needed={v: costs[v].checkpoint_needed for v in victims},
        reason=reason,
        reclaim=reclaim,
        depth=job.cascade_depth + 1,
        levels_down=max(0, max(state.canonical.jobs[v].level for v in victims) - job.level),
    )


def variant_policy(state: State, job: Job) -> Policy:
    """The policy an A/B variant's jobs are decided by: the base policy with the variant's
    overrides. Cached per variant until the next PolicyChanged."""
    base = state.canonical.policy
    overrides = base.ab_variants.get(job.variant)
    if not overrides:
        return base
    cache = state.index.variant_policies
    if job.variant not in cache:
        cache[job.variant] = with_params(base, overrides)
    return cache[job.variant]


def _still_queued(c, job_id: str) -> bool:
    job = c.jobs.get(job_id)
    return job is not None and job.state == QUEUED
