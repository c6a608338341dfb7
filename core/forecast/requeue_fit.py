"""When a victim, requeued after a preemption, would fit again as running jobs end as
estimated (`RequeueFit`): the part of a victim's price that asks where it can really run,
beside the queue's view of its wait (core/forecast/waits.py `ReleaseCurve`).
"""

from __future__ import annotations

import bisect
import heapq

from .fit_order import ordered_single_fit
from .waits import _first_fit_time, fits_memo, node_releases, remaining_or_runtime
from ..model.cordon import takes_work
from ..model.entities import Job, node_free_count
from ..model.state import State
from ..model.up_nodes import UpNodes, nodes_key, size_max


class RequeueFit:
    """When a victim, requeued, would fit again as running jobs end as estimated: where it
    can really run, on one node when it fits one (free GPUs on different nodes do not add
    up for it), else as a gang over the nodes of one GPU model; and without what the
    preemption hands to the preemptor: on the victim's own nodes, its GPUs and the free
    ones go to the preemptor and come back at the preemptor's expected end.

    A node's fit is worked out once per victim size and plan, and the search for a victim
    stops at the first node where it would fit by the wait already known."""

    def __init__(self, state: State, nodes, preemptor_gpus: int, preemptor_runtime_ms: int) -> None:
        self.state = state
        self.nodes = nodes
        self.preemptor_gpus = preemptor_gpus
        self.preemptor_runtime_ms = preemptor_runtime_ms
        self.node_size_max = size_max(nodes)
        # (a list's nodes by name; an `UpNodes` is asked node by node: `_node`)
        self._by_name = None if isinstance(nodes, UpNodes) else {node.name: node for node in nodes}
        self._names = nodes_key(nodes)  # (what the memos tell these nodes by)
        # Per victim size, the nodes ranked by when it fits there (see `_soonest_elsewhere`):
        # the nodes do not change while one plan is priced.
        self._ranked: dict[int, list[tuple[int, str]]] = {}
        self._by_model: list[tuple[str, int, list[tuple[int, int]]]] | None = None

    def wait_ms(self, victim: Job, at_least_ms: int = 0) -> int | None:
        """The victim's earliest fit after the preemption, but no sooner than `at_least_ms`
        (what the caller already knows it waits: the search stops at the first node that
        fits by then); None if it never would here."""
        own = {slot.node: len(slot.gpus) for slot in victim.placement}
        if victim.gpus > self.node_size_max:
            wait = self._gang_wait(victim, own)
            return None if wait is None else max(wait, at_least_ms)
        # The soonest fit on a node the victim does not hold (ranked once per size and plan),
        # then its own nodes as the preemption leaves them: O(own nodes) per victim.
        best = self._soonest_elsewhere(victim.gpus, own)
        for name in sorted(own):
            if best is not None and best <= at_least_ms:
                return at_least_ms  # no node can make it sooner than what is known
            node = self._node(name)
            if node is None or node.gpus < victim.gpus:
                continue
            free, releases = self._after_preemption(node, victim, own[name])
            wait = _first_fit_time(free, releases, victim.gpus)
            if wait is not None and (best is None or wait < best):
                best = wait
        return None if best is None else max(best, at_least_ms)

    def _node(self, name: str):
        """The node of that name if it is one of these nodes, else None."""
        if self._by_name is not None:
            return self._by_name.get(name)
        nodes = self.nodes
        node = self.state.canonical.nodes.get(name)
        if (
            node is None
            or name in nodes.excluded
            or node.gpu_model not in nodes.models
            or not takes_work(node)
        ):
            return None
        return node

    def _soonest_elsewhere(self, gpus: int, own: dict[str, int]) -> int | None:
        # The soonest fit on a node the victim does not hold, read from the kept fit orders
        # (core/forecast/fit_order.py) when the nodes are an `UpNodes`: the fronts, not every
        # node.
        nodes = self.nodes
        if isinstance(nodes, UpNodes):
            others = UpNodes(self.state, nodes.models, [*nodes.excluded, *own])
            answered, fit = ordered_single_fit(self.state, others, gpus)
            if answered:
                return None if fit is None else fit[0]
        return self._soonest_elsewhere_ranked(gpus, own)

    def _soonest_elsewhere_ranked(self, gpus: int, own: dict[str, int]) -> int | None:
        # Per victim size: (earliest fit, node) over the nodes as they are, soonest first;
        # memoised (`fits_memo`): the same for every plan over these nodes.
        ranked = self._ranked.get(gpus)
        if ranked is None:
            ranked = self._ranked[gpus] = self._ranked_nodes(gpus)
        for wait, name in ranked:
            if name not in own:
                return wait
        return None

    def _ranked_nodes(self, gpus: int) -> list[tuple[int, str]]:
        memo = fits_memo(self.state)
        key = ("ranked", gpus, self._names)
        ranked = memo.get(key)
        if ranked is None:
            ranked = memo[key] = sorted(
                (wait, node.name)
                for node in self.nodes
                if node.gpus >= gpus
                and (wait := _first_fit_time(node_free_count(node), node_releases(self.state, node), gpus))
                is not None
            )
        return ranked

    def _after_preemption(self, node, victim: Job, own_gpus: int) -> tuple[int, list[tuple[int, int]]]:
        """The node's free GPUs and releases once the preemptor has taken the victim's GPUs
        and the free ones it needs there."""
        free = node_free_count(node)
        taken = min(self.preemptor_gpus, free + own_gpus)
        releases = list(node_releases(self.state, node))
        mine = (remaining_or_runtime(self.state, victim.id), own_gpus)
        if mine in releases:
            releases.remove(mine)
        bisect.insort(releases, (self.preemptor_runtime_ms, taken))
        return max(0, free + own_gpus - taken), releases

    def _gang_wait(self, victim: Job, own: dict[str, int]) -> int | None:
        # Per model, the nodes' free GPUs and releases pooled as they are (memoised, see
        # `fits_memo`); the victim's own nodes' part is swapped for what the preemption
        # leaves there, and the two walked merged, soonest first.
        best = None
        for model, free_all, pooled in self._pooled_by_model():
            free_total = free_all
            skip: dict[tuple[int, int], int] = {}
            mine: list[tuple[int, int]] = []
            for name in own:
                node = self._node(name)
                if node is None or node.gpu_model != model:
                    continue
                free_total -= node_free_count(node)
                for release in node_releases(self.state, node):
                    skip[release] = skip.get(release, 0) + 1
                free, releases = self._after_preemption(node, victim, own[name])
                free_total += free
                mine += releases
            mine.sort()
            wait = _first_fit_time(free_total, heapq.merge(_without(pooled, skip), mine), victim.gpus)
            if wait is not None and (best is None or wait < best):
                best = wait
        return best

    def _pooled_by_model(self) -> list[tuple[str, int, list[tuple[int, int]]]]:
        if self._by_model is not None:
            return self._by_model
        self._by_model = self._pooled_by_model_memo()
        return self._by_model

    def _pooled_by_model_memo(self) -> list[tuple[str, int, list[tuple[int, int]]]]:
        memo = fits_memo(self.state)
        key = ("by_model", self._names)
        pooled = memo.get(key)
        if pooled is None:
            pooled = []
            for model in sorted(dict.fromkeys(node.gpu_model for node in self.nodes)):
                of_model = [node for node in self.nodes if node.gpu_model == model]
                pooled.append(
                    (
                        model,
                        sum(node_free_count(node) for node in of_model),
                        sorted(r for node in of_model for r in node_releases(self.state, node)),
                    )
                )
            memo[key] = pooled
        return pooled


def _without(releases: list[tuple[int, int]], skip: dict[tuple[int, int], int]):
    """`releases` (sorted) less the multiset `skip`, in order."""
    skip = dict(skip)
    for release in releases:
        if skip.get(release):
            skip[release] -= 1
            continue
        yield release
