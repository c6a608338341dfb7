"""The up nodes of some GPU models that take work (not cordoned: core/model/cordon.py),
less a few held ones, read from the index (`Index.up_nodes_by_model`) as they are needed:
what a reservation or a preemption plan weighs, without listing and filtering the whole
pool at every step. `UpNodes` iterates as the list it stands for would (nodes in name
order) and names that set in `key`, so that forecasts over it are memoised without
spelling every node's name; forecasts that know it (`core.forecast.fit_order`) read the
index's order instead of every node.

A set is read within the step that made it: the index it reads changes when a node joins,
goes down or is cordoned.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from .cordon import takes_work
from .entities import Node
from .state import State


class UpNodes:
    """The up nodes of `models` not named in `excluded`, in name order (see the module)."""

    __slots__ = ("models", "excluded", "key", "_nodes", "_names", "_sizes")

    def __init__(self, state: State, models, excluded=()) -> None:
        ix = state.index
        self.models = tuple(sorted(m for m in dict.fromkeys(models) if m in ix.up_nodes_by_model))
        self.excluded = dict.fromkeys(excluded)  # (a copy: the caller's may grow)
        # (What a memo tells this set by: the models, and the names left out of them.)
        self.key = ("up", self.models, tuple(sorted(excluded)))
        self._nodes = state.canonical.nodes
        self._names = [ix.up_nodes_by_model[m] for m in self.models]
        self._sizes = [ix.node_sizes_by_model[m] for m in self.models]

    def names(self) -> Iterator[str]:
        """The names of the nodes, in order."""
        lists = self._names
        names = lists[0] if len(lists) == 1 else heapq.merge(*lists) if lists else ()
        excluded = self.excluded
        if not excluded:
            return iter(names)
        return (name for name in names if name not in excluded)

    def __iter__(self) -> Iterator[Node]:
        nodes = self._nodes
        return (nodes[name] for name in self.names())

    def __bool__(self) -> bool:
        return next(self.names(), None) is not None

    def size_max(self) -> int:
        """GPUs of the largest node of the set (0 when it has none): what
        `max(node.gpus for node in nodes)` gives, from the counts of node sizes."""
        sizes: dict[int, int] = {}
        for by_size in self._sizes:
            for gpus, count in by_size.items():
                sizes[gpus] = sizes.get(gpus, 0) + count
        for name in self.excluded:
            node = self._nodes.get(name)
            if node is not None and takes_work(node) and node.gpu_model in self.models:
                sizes[node.gpus] -= 1
        return max((gpus for gpus, count in sizes.items() if count > 0), default=0)


def size_max(nodes) -> int:
    """GPUs of the largest of `nodes` (an `UpNodes` or a list of nodes), 0 for none."""
    if isinstance(nodes, UpNodes):
        return nodes.size_max()
    return max((node.gpus for node in nodes), default=0)


def nodes_key(nodes) -> tuple:
    """What a memo of a forecast over `nodes` (an `UpNodes` or a list of nodes) tells them by."""
    if isinstance(nodes, UpNodes):
        return nodes.key
    return tuple(node.name for node in nodes)
