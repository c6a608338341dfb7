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
Reads the state; writes only the scratch's caches (core/model/scratch.py).
"""

from __future__ import annotations

import msgspec

from ..forecast.requeue_fit import RequeueFit
from ..forecast.waits import ReleaseCurve, expected_runtime_ms, natural_wait_ms
from ..model.placement import acceptable_models, node_size_max, place
from ..model.state import State
from ..model.cordon import takes_work
from ..model.up_nodes import UpNodes
from ..model.entities import QUEUED, Job, Node
from ..model.types import Slot
from ..rules.benefit import BELOW_COST, NET_BENEFIT_MIN, priced_out_at, worth
from ..rules.decision import Decision
from ..rules.eligibility import HELD_NODE, eligible_victims, first_refusal, less_urgent_holders, refusals
from ..rules.fairness import USER_PREEMPTING
from ..rules.guarantees import TEAM_SHARE, Guard
from ..rules.holds import binding_holds, victim_cap
from ..rules.pricing import LazyPrices, Pricing, VictimCost, price_victims, pricing_for
from ..rules.rights import DEPTH, depth_refusal
from ..rules.substitutes import substitute_penalty, substitutes
from .placement import reserved_nodes
from .bounded import NO_ELIGIBLE, NO_SET, choose_on_one_node_bounded, set_prospect
from .victims import (
    NegativeCost,
    SetSearch,
    cannot_free_enough,
    choose_victims,
    no_set_rule,
)


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
    # How much cheaper a set on a node the budgeted search did not price could be (0: the
    # search was whole; core/passes/bounded.py).
    regret_max: float = 0.0


class Decline(msgspec.Struct, kw_only=True):
    """Why no preemption is made for a job now: a reason code (what the log records),
    benefit and cost when it was priced and, when the plan was asked to `diagnose`, the
    rule behind it (`limit`, the policy parameter or shield that refused) and the jobs it
    kept from being victims (`blocked`), for the explanation."""

    reason: str
    benefit: float = 0.0
    cost: float = 0.0
    limit: str = ""
    blocked: list[str] = []


class Scope(msgspec.Struct, kw_only=True):
    """Where a preemption for the job may free GPUs: its models, their up nodes not held for
    other blocked jobs, the nodes held (node -> expected start), and its expected runtime."""

    models: list[str]
    nodes: list[Node] | UpNodes  # (read from the index as needed: core/model/up_nodes.py)
    held: dict[str, int]
    runtime_ms: int


def plan_preemption(
    state: State, job: Job, reclaim: bool = False, known_decline: str = "", diagnose: bool = False
) -> Plan | Decline:
    """Victims for a blocked job by priority or, with `reclaim`, by its team's fair share:
    then the victims are other teams' jobs above their shares, of any level from
    `fair_share_from_level` on, and they are charged the work wasted but no displacement (the
    GPUs they give back were the reclaiming team's share, lent while it did not ask).
    `known_decline`: a decline the caller would record nothing for (the job's last one);
    when sure of a `benefit_below_cost` decline, the plan may return it without its
    benefit and cost (`core.rules.benefit.priced_out_at`). `diagnose`: a decline names the
    rule behind it (the explanation asks; the decision does not need to)."""
    d = Decision(state, job, reclaim)
    # A user past the allowance may still displace their own jobs: the limit counts only
    # preemptions of others' work.
    if d.own_only and reclaim:
        return Decline(reason="user_preempting_limit", limit=USER_PREEMPTING)
    if depth_refusal(job, d.depth_max):
        # Displaced by a cascade already as deep as its team or user may go: it waits.
        return Decline(reason="preemption_depth_limit", limit=DEPTH)
    p = d.policy
    guard = Guard(state, job, p)
    if reclaim and not guard.below_share_with(job):
        return Decline(reason="reclaim_beyond_share", limit=TEAM_SHARE)
    scope = preemption_scope(state, job)
    if isinstance(scope, Decline):
        return scope
    stand_ins = substitutes(p, job)
    models = scope.models + list(stand_ins)
    if not reclaim and not stand_ins and job.gpus <= node_size_max(scope.models, state.index):
        return _plan_on_one_node(d, guard, scope, known_decline, diagnose)
    eligible = eligible_victims(d, guard, models, scope.held)
    if not eligible:
        if d.own_only:
            return Decline(reason="user_preempting_limit", limit=USER_PREEMPTING)
        return _diagnosed(d, guard, Decline(reason="no_eligible_victims"), models, scope, None, diagnose)
    cap = victim_cap(state, p, job, scope.models)
    if not stand_ins and cannot_free_enough(
        SetSearch(state, job, guard, cap), scope.models, scope.nodes, eligible
    ):
        # Whatever the prices: skip them.
        return _diagnosed(
            d, guard, Decline(reason="no_victim_set_within_limits"), models, scope, eligible, diagnose
        )
    curve = ReleaseCurve(state, scope.nodes, scope.runtime_ms)
    natural_wait = natural_wait_ms(state, job, scope.nodes, curve)
    pricing = pricing_for(state, job, p, scope.runtime_ms, natural_wait)
    if reclaim:
        costs = price_victims(state, job, eligible, p, pricing, curve, None)
        choice, penalty = _choose_with_substitutes(d, scope, stand_ins, costs, pricing, guard)
    else:
        fit = RequeueFit(state, scope.nodes, job.gpus, scope.runtime_ms)
        lazy = LazyPrices(state, job, eligible, p, pricing, curve, fit)
        choice, penalty, costs = _choose_priced(d, scope, stand_ins, lazy, guard)
    if choice is None:
        return _diagnosed(
            d, guard, Decline(reason="no_victim_set_within_limits"), models, scope, eligible, diagnose
        )
    victims, placement = choice
    if not victims:  # it fits on GPUs held for a starving job: it waits like everyone else
        return Decline(reason="held_back_by_reservation", limit=HELD_NODE)
    return judge(d, guard, costs, victims, placement, natural_wait, penalty)


def _plan_on_one_node(
    d: Decision, guard: Guard, scope: "Scope", known_decline: str, diagnose: bool
) -> Plan | Decline:
    """`plan_preemption` for a job that fits one node on its own models: its victims found
    from the victims' side (core/passes/bounded.py), never listed whole, the same plan or
    decline as from the list of every eligible victim while the search is whole."""
    state, job, p = d.state, d.job, d.policy
    cap = victim_cap(state, p, job, scope.models)
    prospect = set_prospect(d, SetSearch(state, job, guard, cap), scope.models, scope.held)
    if prospect == NO_ELIGIBLE:
        if d.own_only:
            return Decline(reason="user_preempting_limit", limit=USER_PREEMPTING)
        return _diagnosed(
            d, guard, Decline(reason="no_eligible_victims"), scope.models, scope, None, diagnose
        )
    if prospect == NO_SET:  # whatever the prices: skip them
        eligible = eligible_victims(d, guard, scope.models, scope.held) if diagnose else []
        return _diagnosed(
            d, guard, Decline(reason="no_victim_set_within_limits"), scope.models, scope, eligible, diagnose
        )
    curve = ReleaseCurve(state, scope.nodes, scope.runtime_ms)
    natural_wait = natural_wait_ms(state, job, scope.nodes, curve)
    pricing = pricing_for(state, job, p, scope.runtime_ms, natural_wait)
    fit = RequeueFit(state, scope.nodes, job.gpus, scope.runtime_ms)
    prices = LazyPrices(state, job, [], p, pricing, curve, fit)
    search = SetSearch(state, job, guard, cap, pricing)
    out_at = priced_out_at(job, p, pricing, natural_wait) if known_decline == BELOW_COST else None
    regret = 0.0
    try:
        found = choose_on_one_node_bounded(
            d, search, scope.models, scope.held, prices, p.preemption_candidate_nodes_max, out_at
        )
        if isinstance(found, str):  # victims.PRICED_OUT
            return Decline(reason="benefit_below_cost", limit=NET_BENEFIT_MIN)
        choice, costs, regret = found.choice, prices.exact_costs(), found.regret
    except NegativeCost:  # no bound holds: every eligible victim priced
        eligible = eligible_victims(d, guard, scope.models, scope.held)
        costs = price_victims(state, job, eligible, p, pricing, curve, fit)
        choice = choose_victims(search, scope.models, scope.nodes, costs)
    if choice is None:
        eligible = eligible_victims(d, guard, scope.models, scope.held) if diagnose else []
        return _diagnosed(
            d, guard, Decline(reason="no_victim_set_within_limits"), scope.models, scope, eligible, diagnose
        )
    victims, placement = choice
    if not victims:  # it fits on GPUs held for a starving job: it waits like everyone else
        return Decline(reason="held_back_by_reservation", limit=HELD_NODE)
    planned = judge(d, guard, costs, victims, placement, natural_wait)
    if isinstance(planned, Plan):
        planned.regret_max = round(regret, 3)
    return planned


def _diagnosed(
    d: Decision, guard: Guard, decline: Decline, models: list[str], scope: "Scope", eligible, diagnose: bool
) -> Decline:
    """`decline` with the rule behind it, when asked: for no eligible victim, the rule that
    refuses the jobs it could otherwise take (`core.rules.eligibility.first_refusal`); for
    no victim set, the first rule without which a set could be found
    (`core.passes.victims.no_set_rule`)."""
    if not diagnose:
        return decline
    if eligible is None:
        found = refusals(d, guard, less_urgent_holders(d.state, d.job, d.reclaim), models, scope.held)
        rule, blocked = first_refusal(found)
    else:
        rule, blocked = no_set_rule(d, guard, scope.models, scope.nodes, eligible, scope.held)
    decline.limit = rule
    decline.blocked = [job.id for job in blocked]
    return decline


def _choose_priced(
    d: Decision, scope: "Scope", stand_ins: dict[str, float], prices: LazyPrices, guard: Guard
):
    """(choice, substitute's extra cost, the victims' costs), every eligible victim priced
    (a job that fits one node on its own models is `_plan_on_one_node`'s)."""
    costs = {victim_id: prices.exact(victim_id) for victim_id in prices.victims}
    choice, penalty = _choose_with_substitutes(d, scope, stand_ins, costs, prices.pricing, guard)
    return choice, penalty, costs


def _choose_with_substitutes(
    d: Decision, scope: "Scope", stand_ins: dict[str, float], costs: dict[str, VictimCost], pricing: Pricing,
    guard: Guard,
):  # fmt: skip
    """The cheapest victim set on the job's own models or, priced with the extra run time
    (core/rules/substitutes.py), on a compatible model; (choice, that extra cost)."""
    state, job, p = d.state, d.job, d.policy
    search = SetSearch(state, job, guard, victim_cap(state, p, job, scope.models), pricing)
    if not stand_ins:
        return choose_victims(search, scope.models, scope.nodes, costs), 0.0
    c = state.canonical
    nodes_of = {
        model: [
            c.nodes[name]
            for name in sorted(c.nodes)
            if takes_work(c.nodes[name]) and c.nodes[name].gpu_model == model and name not in scope.held
        ]
        for model in stand_ins
    }
    best = None
    groups = [(scope.models, scope.nodes, 0.0)] + [([m], nodes_of[m], stand_ins[m]) for m in stand_ins]
    for models, nodes, slowdown in groups:
        if not nodes:
            continue
        choice = choose_victims(search, models, nodes, costs)
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
    nodes = UpNodes(state, models)
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
        nodes = UpNodes(state, models, held)
        if not nodes:
            return Decline(reason="held_back_by_reservation")
    return Scope(models=models, nodes=nodes, held=held, runtime_ms=runtime)


def judge(
    d: Decision, guard: Guard, costs: dict[str, VictimCost], victims: list[str], placement: list[Slot],
    natural_wait: int, substitute_cost: float = 0.0,
) -> Plan | Decline:  # fmt: skip
    """The plan for `victims`, or the decline when it is not worth making
    (`core.rules.benefit.worth`)."""
    job = d.job
    refusal, benefit, cost, ready = worth(
        d.policy, job, d.t, [costs[v] for v in victims], natural_wait, substitute_cost
    )
    if refusal:
        return Decline(reason=refusal, benefit=round(benefit, 3), cost=round(cost, 3), limit=NET_BENEFIT_MIN)
    reason = (
        f"saves {natural_wait - ready} ms of level-{job.level} wait on {job.gpus} GPUs;"
        f" victims lose {sum(costs[v].lost_ms for v in victims)} ms of progress"
    )
    if substitute_cost:
        reason += f"; on a compatible GPU model, priced {substitute_cost:.0f} for the longer run"
    if d.reclaim:
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
        reclaim=d.reclaim,
        depth=job.cascade_depth + 1,
        levels_down=max(0, max(d.state.canonical.jobs[v].level for v in victims) - job.level),
    )


def _still_queued(c, job_id: str) -> bool:
    job = c.jobs.get(job_id)
    return job is not None and job.state == QUEUED
