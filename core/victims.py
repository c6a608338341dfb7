"""Choosing the victim set: among the eligible, priced victims, the cheapest minimal set
that frees a gang placement for the preemptor within the `Guard` and the victim cap. A job
that fits one node takes victims on one node (the cheapest node, ties by fewer victims,
then node name); a larger gang takes victims across the nodes of one GPU model, cheapest
per usable GPU first. Greedy cheapest-first, then any victim not needed is dropped.
"""

from __future__ import annotations

from .fairness import Guard
from .placement import free_indices, gpus_on, node_size_max
from .pricing import Pricing, VictimCost
from .state import Job, State, node_free_count
from .types import Slot


def choose_victims(state: State, job: Job, models: list[str], nodes, costs: dict[str, VictimCost],
                   pricing: Pricing, guard: Guard, cap: int) -> tuple[list[str], list[Slot]] | None:
    """The victim set and the preemptor's placement, or None when no set within the guard
    and the cap frees enough GPUs."""
    c = state.canonical
    victim_nodes = dict.fromkeys(slot.node for v in costs for slot in c.jobs[v].placement)
    candidate_nodes = [node for node in nodes if node.name in victim_nodes]
    # Victims are chosen by their cost plus the preemptor's weighted wait while they reach a
    # safe point (and save): an urgent job prefers victims that can let go quickly.
    rank = {v: vc.cost + pricing.waiting_weight * vc.ready_ms for v, vc in costs.items()}
    if job.gpus <= node_size_max(models, state.index):
        return _cheapest_single_node(state, job, candidate_nodes, rank, guard, cap)
    return _cheapest_across_nodes_of_one_model(state, job, nodes, rank, guard, cap)


def _cheapest_single_node(state: State, job: Job, nodes, rank: dict[str, float], guard: Guard,
                          cap: int) -> tuple[list[str], list[Slot]] | None:
    best = None
    for node in nodes:
        free = free_indices(node)
        need = job.gpus - len(free)
        if need <= 0 or node.gpus < job.gpus:
            continue
        on_node = sorted((rank[v], v) for v in state.index.jobs_by_node.get(node.name, {})
                         if v in rank)
        chosen = _greedy_minimal(state, [(score, v, len(gpus_on(state.canonical.jobs[v], node.name)))
                                         for score, v in on_node], need, guard)
        if chosen is None or len(chosen) > cap:
            continue
        total = sum(rank[v] for v in chosen)
        key = (total, len(chosen), node.name)
        if best is None or key < best[0]:
            freed = sorted(free + [g for v in chosen for g in gpus_on(state.canonical.jobs[v], node.name)])
            best = (key, sorted(chosen), [Slot(node=node.name, gpus=freed[:job.gpus])])
    return None if best is None else (best[1], best[2])


def _cheapest_across_nodes_of_one_model(state: State, job: Job, nodes, rank: dict[str, float],
                                        guard: Guard, cap: int) -> tuple[list[str], list[Slot]] | None:
    """A gang is of one GPU model: the cheapest victim set over the models the job accepts."""
    best = None
    for model in sorted(dict.fromkeys(node.gpu_model for node in nodes)):
        of_model = [node for node in nodes if node.gpu_model == model]
        choice = _cheapest_across_nodes(state, job, of_model, rank, guard, cap)
        if choice is not None:
            key = (sum(rank[v] for v in choice[0]), len(choice[0]), model)
            if best is None or key < best[0]:
                best = (key, choice)
    return None if best is None else best[1]


def _cheapest_across_nodes(state: State, job: Job, nodes, rank: dict[str, float], guard: Guard,
                           cap: int) -> tuple[list[str], list[Slot]] | None:
    free_total = sum(node_free_count(node) for node in nodes)
    need = job.gpus - free_total
    node_names = {node.name: None for node in nodes}
    units = []
    for v in sorted(rank):
        victim = state.canonical.jobs[v]
        usable = sum(len(s.gpus) for s in victim.placement if s.node in node_names)
        units.append((rank[v] / max(usable, 1), v, usable))
    units.sort()
    chosen = _greedy_minimal(state, units, need, guard)
    if chosen is None or len(chosen) > cap:
        return None
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


def _greedy_minimal(state: State, units: list[tuple[float, str, int]], need: int,
                    guard: Guard) -> list[str] | None:
    """Cheapest-first until `need` GPUs are freed, then drop any victim not needed."""
    if need <= 0:
        return []
    chosen: list[tuple[float, str, int]] = []
    taken: dict = {}
    freed = 0
    for unit in units:
        victim = state.canonical.jobs[unit[1]]
        if not guard.allows(taken, victim):
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
