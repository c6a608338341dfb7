"""Choosing the victim set: among the eligible, priced victims, the cheapest minimal set
that frees a gang placement for the preemptor within the `Guard` and the victim cap. A set
is priced as it really lets go (`set_price`): the victims' costs summed, the preemptor's
wait for the slowest counted once. A job that fits one node takes victims on one node (the
cheapest node, ties by fewer victims, then node name); a larger gang takes victims across
the nodes of one GPU model, cheapest per usable GPU first. For each bound on the slowest
victim's release, greedy cheapest-first among the victims that let go by then, then any
victim not needed is dropped; the cheapest of those sets wins.
"""

from __future__ import annotations

from ..model.placement import free_indices, gpus_on, node_size_max
from ..rules.pricing import Pricing, VictimCost
from ..model.state import State
from ..model.entities import Job, node_free_count
from ..model.types import Slot
from ..rules.decision import Decision
from ..rules.eligibility import first_refusal, refusals
from ..rules.guarantees import LEVEL_SHARE, TEAM_SHARE, Guard
from ..rules.holds import VICTIM_CAP

# Release times tried as the slowest victim's, per node or gang: each distinct one up to
# this many (victims' releases differ by their checkpoint costs).
READY_BOUNDS_MAX = 8


class SetSearch:
    """What one search for a victim set reads: the state, the preemptor, the `Guard` and the
    victim cap a set keeps, and what a set is priced against (None where prices are not
    looked at)."""

    __slots__ = ("state", "job", "guard", "cap", "pricing")

    def __init__(
        self, state: State, job: Job, guard: Guard, cap: int, pricing: Pricing | None = None
    ) -> None:
        self.state = state
        self.job = job
        self.guard = guard
        self.cap = cap
        self.pricing = pricing

    @property
    def priced(self) -> Pricing:
        """What a set is priced against: a search that compares prices is given it."""
        assert self.pricing is not None, "a search comparing set prices needs its Pricing"
        return self.pricing


def choose_victims(
    search: SetSearch, models: list[str], nodes, costs: dict[str, VictimCost]
) -> tuple[list[str], list[Slot]] | None:
    """The victim set and the preemptor's placement, or None when no set within the guard
    and the cap frees enough GPUs. Between two sets, in order (README, "How a preemption
    is decided"): 1. the lower `set_price`; 2. fewer victims; 3. the node's (for a gang,
    the GPU model's) name."""
    state = search.state
    c = state.canonical
    victim_nodes = dict.fromkeys(slot.node for v in costs for slot in c.jobs[v].placement)
    candidate_nodes = [node for node in nodes if node.name in victim_nodes]
    if search.job.gpus <= node_size_max(models, state.index):
        return _cheapest_single_node(search, candidate_nodes, costs)
    return _cheapest_across_nodes_of_one_model(search, nodes, costs)


def set_price(costs: dict[str, VictimCost], victims: list[str], pricing: Pricing) -> float:
    """What a victim set costs as it really lets go: the victims' costs summed, and the
    preemptor's weighted wait once, for the slowest of them (they are notified together
    and reach their safe points in parallel)."""
    if not victims:
        return 0.0
    slowest_ms = max(costs[v].ready_ms for v in victims)
    return sum(costs[v].cost for v in victims) + pricing.waiting_weight * slowest_ms


def _ready_bounds(costs: dict[str, VictimCost], victims, most: int) -> list[int]:
    """The release times to try as the slowest victim's: each distinct one (at most `most`,
    spread evenly, always the latest, so the set of all victims is tried)."""
    bounds = sorted({costs[v].ready_ms for v in victims})
    if len(bounds) > most:
        step = len(bounds) / most
        bounds = sorted({bounds[int(i * step)] for i in range(most)} | {bounds[-1]})
    return bounds


def _cheapest_single_node(
    search: SetSearch, nodes, costs: dict[str, VictimCost]
) -> tuple[list[str], list[Slot]] | None:
    """Per node, for each bound on the slowest victim's release: the victims that let go by
    then, cheapest first, until the job fits; the best set of all."""
    job = search.job
    jobs_by_node = search.state.index.jobs_by_node
    best = None
    for node in nodes:
        free = free_indices(node)
        need = job.gpus - len(free)
        if need <= 0 or node.gpus < job.gpus:
            continue
        on_node = [v for v in jobs_by_node.get(node.name, {}) if v in costs]
        best = _best_on_node(search, node, free, need, on_node, costs, best)
    return None if best is None else (best[1], best[2])


def _best_on_node(search: SetSearch, node, free: list[int], need: int, on_node: list[str], costs, best):
    """`best` ((key, victims, placement) or None), or a set on this node that beats it."""
    state, job, cap, pricing = search.state, search.job, search.cap, search.priced
    tried: set[tuple[str, ...]] = set()
    for bound in _ready_bounds(costs, on_node, READY_BOUNDS_MAX):
        units = sorted(
            (costs[v].cost, v, len(gpus_on(state.canonical.jobs[v], node.name)))
            for v in on_node
            if costs[v].ready_ms <= bound
        )
        chosen = _greedy_minimal(search, units, need)
        if chosen is None or len(chosen) > cap or tuple(sorted(chosen)) in tried:
            continue
        tried.add(tuple(sorted(chosen)))
        key = (set_price(costs, chosen, pricing), len(chosen), node.name)
        if best is None or key < best[0]:
            freed = sorted(free + [g for v in chosen for g in gpus_on(state.canonical.jobs[v], node.name)])
            best = (key, sorted(chosen), [Slot(node=node.name, gpus=freed[: job.gpus])])
    return best


PRICED_OUT = "priced_out"  # a bounded search: whatever set wins, it costs too much


# A bound is a sum taken in another order than a set's price: shrunk by this share, it stays
# below every set's price whatever the rounding of either sum.
BOUND_ROUNDING_SHARE = 1e-9


def node_bound(prices, node_name: str, need: int, on_node: list[str], waiting_weight: float) -> float:
    """A price no victim set on the node can be below: the cheapest cover of the `need` GPUs
    the job lacks there by its victims' lower prices (`LazyPrices.lower`), cheapest per GPU
    they free on the node first, the last one counted by the share of its GPUs needed (a
    set's victims cost at least their GPUs' shares, none negative, and free `need` GPUs or
    more), plus the preemptor's weighted wait for the quickest release among them (a set's
    slowest release is no quicker). Raises `NegativeCost` when a bound does not hold."""
    jobs = prices.state.canonical.jobs
    units = []
    ready_min = None
    for v in on_node:
        lower = prices.lower(v)
        if lower.cost < 0:
            raise NegativeCost
        freed = max(1, len(gpus_on(jobs[v], node_name)))
        units.append((lower.cost / freed, freed, lower.cost))
        if ready_min is None or lower.ready_ms < ready_min:
            ready_min = lower.ready_ms
    if waiting_weight < 0:
        raise NegativeCost
    units.sort()
    cover = 0.0
    left = need
    for per_gpu, freed, cost in units:
        if freed >= left:
            cover += cost if freed == left else per_gpu * left
            left = 0
            break
        cover += cost
        left -= freed
    if left > 0:  # its victims cannot free enough: what they all cost is still below any set
        cover = sum(unit[2] for unit in units)
    waited = waiting_weight * (ready_min or 0)
    # Any set holds a victim at least as dear as the cheapest: that bound needs no rounding
    # margin (a sum of prices none negative is never below one of them, however rounded).
    cheapest = min(unit[2] for unit in units)
    return max(cheapest + waited, (cover + waited) * (1.0 - BOUND_ROUNDING_SHARE))


class NegativeCost(Exception):
    """A victim priced below zero (a policy with negative weights): no bound holds."""


def _cheapest_across_nodes_of_one_model(
    search: SetSearch, nodes, costs: dict[str, VictimCost]
) -> tuple[list[str], list[Slot]] | None:
    """A gang is of one GPU model: the cheapest victim set over the models the job accepts."""
    best = None
    for model in sorted(dict.fromkeys(node.gpu_model for node in nodes)):
        of_model = [node for node in nodes if node.gpu_model == model]
        choice = _cheapest_across_nodes(search, of_model, costs)
        if choice is not None:
            key = (set_price(costs, choice[0], search.priced), len(choice[0]), model)
            if best is None or key < best[0]:
                best = (key, choice)
    return None if best is None else best[1]


def _cheapest_across_nodes(
    search: SetSearch, nodes, costs: dict[str, VictimCost]
) -> tuple[list[str], list[Slot]] | None:
    """For each bound on the slowest victim's release: the victims that let go by then,
    cheapest per GPU they free on these nodes first, until the gang fits; the best set."""
    state, job, cap, pricing = search.state, search.job, search.cap, search.priced
    free_total = sum(node_free_count(node) for node in nodes)
    need = job.gpus - free_total
    node_names = {node.name: None for node in nodes}
    units = []
    for v in sorted(costs):
        victim = state.canonical.jobs[v]
        usable = sum(len(s.gpus) for s in victim.placement if s.node in node_names)
        units.append((costs[v].cost / max(usable, 1), v, usable))
    units.sort()
    best = None
    for bound in _ready_bounds(costs, costs, READY_BOUNDS_MAX):
        chosen = _greedy_minimal(search, [u for u in units if costs[u[1]].ready_ms <= bound], need)
        if chosen is None or len(chosen) > cap:
            continue
        key = (set_price(costs, chosen, pricing), len(chosen))
        if best is None or key < best[0]:
            best = (key, chosen)
    if best is None:
        return None
    chosen = best[1]
    chosen_map = dict.fromkeys(chosen)
    placement: list[Slot] = []
    needed = job.gpus
    for node in nodes:
        gpus = [i for i, holder in enumerate(node.holder) if holder == "" or holder in chosen_map]
        take = gpus[:needed]
        if take:
            placement.append(Slot(node=node.name, gpus=take))
            needed -= len(take)
        if needed == 0:
            return sorted(chosen), placement
    return None


def _greedy_minimal(search: SetSearch, units: list[tuple[float, str, int]], need: int) -> list[str] | None:
    """Cheapest-first until `need` GPUs are freed, then drop any victim not needed."""
    if need <= 0:
        return []
    jobs, guard = search.state.canonical.jobs, search.guard
    chosen: list[tuple[float, str, int]] = []
    taken: dict = {}
    freed = 0
    for unit in units:
        victim = jobs[unit[1]]
        if guard.refusal(taken, victim):
            continue
        chosen.append(unit)
        guard.take(taken, victim)
        freed += unit[2]
        if freed >= need:
            break
    if freed < need:
        return None
    for unit in sorted(chosen, reverse=True):  # most expensive first
        if freed - unit[2] >= need:
            chosen.remove(unit)
            freed -= unit[2]
    return [unit[1] for unit in chosen]


def cannot_free_enough(search: SetSearch, models: list[str], nodes, eligible: list[Job]) -> bool:
    """Whether `choose_victims` is sure to find no set, whatever the victims' prices: on no
    node (for a gang, no GPU model) could even the `cap` largest of the victims the guard
    allows one at a time, and no more than each level's guaranteed share leaves, free the
    GPUs the job lacks there. A plan that would end `no_victim_set_within_limits` then skips
    pricing. (Only a necessary condition of a set: prices never make a set possible.)"""
    state, job, guard = search.state, search.job, search.guard
    allowed = [victim for victim in eligible if not guard.refusal({}, victim)]
    if job.gpus <= node_size_max(models, state.index):
        victim_nodes = dict.fromkeys(slot.node for victim in eligible for slot in victim.placement)
        by_node: dict[str, list[tuple[int, Job]]] = {}
        for victim in allowed:
            for name in dict.fromkeys(slot.node for slot in victim.placement):
                by_node.setdefault(name, []).append((len(gpus_on(victim, name)), victim))
        for node in nodes:
            if node.name not in victim_nodes or node.gpus < job.gpus:
                continue
            need = job.gpus - node_free_count(node)
            if need <= 0 or _may_free(search, by_node.get(node.name, []), need):
                return False
        return True
    for model in sorted(dict.fromkeys(node.gpu_model for node in nodes)):
        of_model = {node.name: None for node in nodes if node.gpu_model == model}
        need = job.gpus - sum(node_free_count(node) for node in nodes if node.name in of_model)
        units = [
            (sum(len(slot.gpus) for slot in victim.placement if slot.node in of_model), victim)
            for victim in allowed
        ]
        if need <= 0 or _may_free(search, units, need):
            return False
    return True


def _may_free(search: SetSearch, units: list[tuple[int, Job]], need: int) -> bool:
    """Whether victims of `units` ((GPUs freed here, victim)) might free `need` GPUs: the
    `cap` largest together, and each level's no more than its guaranteed share leaves."""
    guard = search.guard
    largest = sorted((gpus for gpus, _ in units), reverse=True)[: search.cap]
    if sum(largest) < need:
        return False
    by_level: dict[int, int] = {}
    for gpus, victim in units:
        by_level[victim.level] = by_level.get(victim.level, 0) + gpus
    level_gpus = search.state.index.level_gpus
    bound = 0
    for level in sorted(by_level):
        floor = guard.level_floor[level]
        bound += min(by_level[level], level_gpus[level] - floor) if floor else by_level[level]
    return bound >= need


def no_set_rule(
    d: Decision, guard: Guard, models: list[str], nodes, eligible: list[Job], held: dict
) -> tuple[str, list[Job]]:
    """The rule that leaves `d`'s preemption no victim set, and the jobs it holds back: the
    first whose lifting lets `cannot_free_enough` find a set may exist. Were every eligible
    victim allowed, any number of them, and still none: the GPUs it needs are held by jobs
    it may not take, and the rule named is what refuses them. Else, were the guarantees
    lifted: the guarantee that refuses eligible victims. Else the victim cap."""
    state, job = d.state, d.job
    unbounded = len(eligible) + 1
    if cannot_free_enough(SetSearch(state, job, guard.opened(), unbounded), models, nodes, eligible):
        names = {
            node.name: None
            for node in nodes
            if node.gpus >= job.gpus or job.gpus > node_size_max(models, state.index)
        }
        jobs = state.canonical.jobs
        holders = [
            jobs[holder]
            for holder in sorted(
                {holder for name in names for holder in state.index.jobs_by_node.get(name, {})}
            )
        ]
        return first_refusal(refusals(d, guard, holders, models, held))
    if cannot_free_enough(SetSearch(state, job, guard, unbounded), models, nodes, eligible):
        refused = {v.id: guard.refusal({}, v) for v in eligible}
        rule = TEAM_SHARE if TEAM_SHARE in refused.values() else LEVEL_SHARE
        return rule, [v for v in eligible if refused[v.id] == rule]
    return VICTIM_CAP, []
