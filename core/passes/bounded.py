"""The victim set of a job that fits one node, found from the victims' side: the cheapest
candidate nodes first, at most a budget of them priced exactly, and how much cheaper a set
it did not look at could be (`Bounded.regret`).

The running jobs are indexed by victim class and anchor (core.model.state `victim_class`,
`victim_classes`): within a class a victim costs no less the earlier its anchor
(the more progress it would lose), so each class is read from its latest anchor down and
the classes merged by the least price per GPU they may still hold
(core.rules.pricing `victim_cost_floor`). A node is looked at when one of its victims
comes up; its bound is `node_bound` (the cheapest cover of the GPUs the job lacks there).
The nodes with some GPUs free are looked at first; a node not looked at since lacks all the
job's GPUs, and while none of its victims has come up it holds no set cheaper than the
floor: the job's GPUs at the least price per GPU still to come, plus the preemptor's
weighted wait for the quickest safe point of the classes. Nodes are priced exactly (`_best_on_node`)
cheapest bound first while a bound, or that floor, is no more than the best set's price:

- when the bounds and the floor pass the best set's price, no set elsewhere could win or
  tie, so the choice is exactly `choose_victims`' over every node (pools whose candidate
  nodes are within the budget always end so);
- once `preemption_candidate_nodes_max` nodes have been priced and a set found, the best
  so far is taken, and `regret` is its price less the least bound or floor left: no set
  it did not price costs less than the chosen one by more.
"""

from __future__ import annotations

import heapq

from ..model.cordon import takes_work
from ..model.entities import node_free_count
from ..model.state import victim_classes
from ..model.placement import free_indices, gpus_on
from ..model.types import Slot
from ..rules.eligibility import eligible_in_reach
from ..rules.pricing import LazyPrices, victim_cost_floor, victim_safe_point_ms
from .victims import (
    BOUND_ROUNDING_SHARE,
    PRICED_OUT,
    NegativeCost,
    SetSearch,
    _best_on_node,
    _may_free,
    node_bound,
)

INFINITE = float("inf")
SLACK = 1.0 + 4 * BOUND_ROUNDING_SHARE


class Bounded:
    """What the bounded search found: the set and placement (None: no set), whether the
    search was whole (then the set is exactly `choose_victims`'), and the most a set it did
    not price could undercut it by (0 when whole)."""

    __slots__ = ("choice", "whole", "regret")

    def __init__(self, choice: tuple[list[str], list[Slot]] | None, whole: bool, regret: float = 0.0) -> None:
        self.choice = choice
        self.whole = whole
        self.regret = regret


def _eligibility(d, guard, jobs: dict, levels: dict, model_ok: dict, held: dict, admit=None):
    """`is_eligible(victim_id)`: whether that running job is an eligible victim for `d`'s
    preemptor (its level preemptible, `eligible_in_reach`), each asked once; `admit` is
    called with each victim the first time it is found eligible."""
    eligible: dict[str, bool] = {}

    def is_eligible(victim_id: str) -> bool:
        known = eligible.get(victim_id)
        if known is None:
            victim = jobs[victim_id]
            known = eligible[victim_id] = victim.level in levels and eligible_in_reach(
                d, guard, victim, model_ok, held
            )
            if known and admit is not None:
                admit(victim)
        return known

    return is_eligible


# What a job that fits one node may hope for before any victim is priced (`set_prospect`).
NO_ELIGIBLE = "no_eligible"
NO_SET = "no_set"
MAY_FIND = "may_find"


def set_prospect(d, search: SetSearch, models: list[str], held: dict) -> str:
    """Before any price, for `d`'s preemptor that fits one node: `NO_ELIGIBLE` when no running
    job on these models is an eligible victim (running jobs only can be: a victim that is
    starting, reserved or letting go is shielded); `NO_SET` when some are but on no node could
    they free the GPUs the job lacks, whatever their prices (`cannot_free_enough`'s verdict
    over every eligible victim); else `MAY_FIND`. Read from the victims' side: a node is
    checked when one of its eligible victims comes up, and the reading ends at the first node
    where a set may be found, so a busy pool of any size answers after a node or two."""
    state, guard = search.state, search.guard
    jobs = state.canonical.jobs
    model_ok = dict.fromkeys(models)
    levels = dict.fromkeys(d.levels)
    is_eligible = _eligibility(d, guard, jobs, levels, model_ok, held)
    checked: dict[str, None] = {}
    found = False
    for model in models:
        # (In the index's order: the verdict does not depend on which victim comes first.)
        for key, members in victim_classes(state).get(model, {}).items():
            if key[0] not in levels:
                continue
            for _, victim_id in reversed(members):
                if not is_eligible(victim_id):
                    continue
                found = True
                for slot in jobs[victim_id].placement:
                    if slot.node not in checked:
                        checked[slot.node] = None
                        if _may_free_on(search, slot.node, model_ok, held, is_eligible):
                            return MAY_FIND
    return NO_SET if found else NO_ELIGIBLE


def _may_free_on(search: SetSearch, name: str, model_ok: dict, held: dict, is_eligible) -> bool:
    """Whether a set on node `name` may free the job's GPUs (`cannot_free_enough` for one
    node of the plan's scope): it has them free already, or its eligible victims the guard
    allows one at a time might (`_may_free`)."""
    state, job, guard = search.state, search.job, search.guard
    node = state.canonical.nodes.get(name)
    if node is None or not takes_work(node) or node.gpu_model not in model_ok or name in held:
        return False
    if node.gpus < job.gpus:
        return False
    need = job.gpus - node_free_count(node)
    if need <= 0:
        return True
    jobs = state.canonical.jobs
    units = [
        (len(gpus_on(jobs[v], name)), jobs[v])
        for v in state.index.jobs_by_node.get(name, {})
        if is_eligible(v) and not guard.refusal({}, jobs[v])
    ]
    return _may_free(search, units, need)


def choose_on_one_node_bounded(
    d, search: SetSearch, models: list[str], held: dict, prices: LazyPrices, budget: int,
    priced_out_at: float | None = None,
) -> Bounded | str:  # fmt: skip
    """The cheapest set on one node (`choose_victims`' choice when the search ends whole), or
    `PRICED_OUT` as soon as the set it would choose is sure to cost `priced_out_at` or more.
    Victims are admitted to `prices` as they are found eligible. Raises `NegativeCost`
    when a bound does not hold."""
    state, job, pricing, guard = search.state, search.job, search.priced, search.guard
    waiting_weight = pricing.waiting_weight
    if waiting_weight < 0:
        raise NegativeCost
    c = state.canonical
    ix = state.index
    classes_by_model = victim_classes(state)
    jobs = c.jobs
    model_ok = dict.fromkeys(models)
    levels = dict.fromkeys(d.levels)
    is_eligible = _eligibility(d, guard, jobs, levels, model_ok, held, prices.admit)

    # The classes, each at its latest eligible anchor not yet taken: (least price per GPU
    # it may still hold, model, class, index of that victim).
    heads: list[tuple[float, str, tuple, int]] = []
    ready_min = None
    floors: dict[tuple[str, tuple], tuple[int, float]] = {}  # the last anchor's, per class

    def push(model: str, key: tuple, i: int) -> None:
        members = classes_by_model[model][key]
        while i >= 0 and not is_eligible(members[i][1]):
            i -= 1
        if i < 0:
            return
        anchor, victim_id = members[i]
        known = floors.get((model, key))
        if known is not None and known[0] == anchor:
            per_gpu = known[1]  # the same class and anchor: the same floor
        else:
            victim = jobs[victim_id]
            floor = victim_cost_floor(state, victim, prices.queue_wait_at(key[1]), prices.p, pricing)
            if floor < 0:
                raise NegativeCost
            per_gpu = floor / victim.gpus
            floors[(model, key)] = (anchor, per_gpu)
        heapq.heappush(heads, (per_gpu, model, key, i))

    for model in models:
        classes = classes_by_model.get(model, {})
        for key in sorted(classes):
            if key[0] in levels:
                push(model, key, len(classes[key]) - 1)
    for _, model, key, i in heads:
        safe_point = victim_safe_point_ms(jobs[classes_by_model[model][key][i][1]], pricing.safe_point_ms)
        ready_min = safe_point if ready_min is None else min(ready_min, safe_point)

    def floor_left() -> float:
        # Below every set on a node none of whose victims has come up.
        if not heads:
            return INFINITE
        return (job.gpus * heads[0][0] + waiting_weight * (ready_min or 0)) * (1.0 - BOUND_ROUNDING_SHARE)

    seen: dict[str, None] = {}
    nodes_left: list[tuple[float, str, list[int], int, list[str]]] = []

    def look_at(name: str) -> None:
        seen[name] = None
        node = c.nodes.get(name)
        if node is None or not takes_work(node) or node.gpu_model not in model_ok or name in held:
            return
        if node.gpus < job.gpus:
            return
        free = free_indices(node)
        need = job.gpus - len(free)
        if need <= 0:
            return
        on_node = [v for v in ix.jobs_by_node.get(name, {}) if is_eligible(v)]
        if on_node:
            bound = node_bound(prices, name, need, on_node, waiting_weight)
            heapq.heappush(nodes_left, (bound, name, free, need, on_node))

    # The nodes with some GPUs free are looked at first: then a node not looked at lacks all
    # the job's GPUs (a busy pool has few of them; a node with enough free is no candidate).
    for model in models:
        buckets = ix.free_buckets.get(model, {})
        for free_count in sorted(buckets):
            if 0 < free_count < job.gpus:
                for name in buckets[free_count]:
                    look_at(name)
    best = None
    priced = 0
    while True:
        floor = floor_left()
        bound = nodes_left[0][0] if nodes_left else INFINITE
        least = min(bound, floor)
        if least == INFINITE or (best is not None and least > best[0][0]):
            return Bounded(None if best is None else (best[1], best[2]), True)
        # A node whose bound is the floor within rounding is priced before more victims are
        # read (any order is exact: it only decides how soon the search can end).
        if bound > floor * SLACK:
            _, model, key, i = heapq.heappop(heads)
            for slot in jobs[classes_by_model[model][key][i][1]].placement:
                if slot.node not in seen:
                    look_at(slot.node)
            push(model, key, i - 1)
            continue
        if best is not None and priced >= budget:
            return Bounded((best[1], best[2]), False, max(0.0, best[0][0] - least))
        if priced_out_at is not None and best is not None and min(least, best[0][0]) >= priced_out_at:
            return PRICED_OUT  # whatever set wins costs that much
        _, name, free, need, on_node = heapq.heappop(nodes_left)
        costs = {v: prices.exact(v) for v in on_node}
        best = _best_on_node(search, c.nodes[name], free, need, on_node, costs, best)
        priced += 1
