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


PRICED_OUT = "priced_out"  # `choose_on_one_node_lazily`: whatever set wins, it costs too much


def choose_on_one_node_lazily(
    search: SetSearch, nodes, prices, priced_out_at: float | None = None
) -> tuple[list[str], list[Slot]] | str | None:
    """`choose_victims` for a job that fits one node, over `prices` (core.rules.pricing.LazyPrices
    of the eligible victims) instead of every victim's exact cost: the same set. A node's
    sets all cost at least its victims' cheapest bound (`LazyPrices.lower`) plus the
    preemptor's weighted wait for its quickest release (a set's costs, none negative, sum
    to at least its cheapest; its slowest release is no quicker than the quickest), so the
    nodes are tried by that bound, cheapest first, and those whose bound exceeds the best
    set's price are never priced exactly: no set of theirs could win, not even a tie. None
    with the victims priced exactly is the caller's to ask (a negative cost: no bound).
    `priced_out_at`: a `set_price` at which the caller declines whatever set it is given;
    `PRICED_OUT` as soon as the set that would be chosen is sure to cost that much (every
    node left bounded at it or above, and the best set so far too, or, with none yet, a
    set sure to be found on a node left: `surely_has_set`), without pricing the rest."""
    candidates = one_node_candidates(search, nodes, prices)
    best = None
    # Once no node left is sure to hold a set, none after it is (the nodes left only shrink).
    sure_set_left = True
    for i, (bound, _, node, free, need, on_node) in enumerate(candidates):
        if best is not None and bound > best[0][0]:
            break  # neither this node nor any after it can beat the best set
        if priced_out_at is not None and bound >= priced_out_at:
            if best is not None:
                if best[0][0] >= priced_out_at:
                    return PRICED_OUT
            elif sure_set_left:
                if any(surely_has_set(search, c[2], c[4], c[5]) for c in candidates[i:]):
                    return PRICED_OUT
                sure_set_left = False
        costs = {v: prices.exact(v) for v in on_node}
        best = _best_on_node(search, node, free, need, on_node, costs, best)
    return None if best is None else (best[1], best[2])


def one_node_candidates(search: SetSearch, nodes, prices) -> list[tuple]:
    """The nodes where victims could free the job a place, cheapest bound first: (the bound
    below every set's `set_price` there, node name, node, its free GPUs, GPUs it lacks,
    the eligible victims on it). Raises `NegativeCost` when a bound does not hold."""
    state, job, pricing = search.state, search.job, search.priced
    c = state.canonical
    victims = prices.victims
    victim_nodes = dict.fromkeys(slot.node for v in victims for slot in c.jobs[v].placement)
    jobs_by_node = state.index.jobs_by_node
    waiting_weight = pricing.waiting_weight
    candidates = []
    for node in nodes:
        if node.name not in victim_nodes:
            continue
        free = free_indices(node)
        need = job.gpus - len(free)
        if need <= 0 or node.gpus < job.gpus:
            continue
        on_node = [v for v in jobs_by_node.get(node.name, {}) if v in victims]
        if not on_node:
            continue
        lowers = [prices.lower(v) for v in on_node]
        cheapest = min(lower.cost for lower in lowers)
        if cheapest < 0 or waiting_weight < 0:
            raise NegativeCost
        bound = cheapest + waiting_weight * min(lower.ready_ms for lower in lowers)
        candidates.append((bound, node.name, node, free, need, on_node))
    candidates.sort(key=lambda candidate: candidate[:2])
    return candidates


def surely_has_set(search: SetSearch, node, need: int, on_node: list[str]) -> bool:
    """Whether `_best_on_node` is sure to find a set on the node, whatever the victims'
    prices: the guard spares no team, and every victim there may join any set (taking all
    of a level's victims on the node keeps its guaranteed share), so at the latest release
    bound (always tried) greedy takes victims until the GPUs the job lacks are freed; the
    set left after dropping those not needed has at most `need` victims (each frees one
    GPU or more), within the cap when `need` is. (A sufficient condition only.)"""
    state, guard = search.state, search.guard
    if guard.guarantees_teams or need > search.cap:
        return False
    jobs = state.canonical.jobs
    freed = 0
    by_level: dict[int, int] = {}
    for v in on_node:
        victim = jobs[v]
        freed += len(gpus_on(victim, node.name))
        by_level[victim.level] = by_level.get(victim.level, 0) + victim.gpus
    if freed < need:
        return False
    level_gpus = state.index.level_gpus
    return all(
        not guard.level_floor[level] or level_gpus[level] - taken >= guard.level_floor[level]
        for level, taken in by_level.items()
    )


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
