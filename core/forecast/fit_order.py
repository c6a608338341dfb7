"""The up nodes of a GPU model in the order a gang of `need` GPUs fits on them alone, kept
across steps (`FitOrder`, in the scratch): the earliest single-node fit of a reservation is
read from the front of the order instead of from every node's kept line
(`core.forecast.node_fit.earliest_single_fit`, which this gives exactly).

Why an order kept across time holds: a node's fit is `intercept + slope * t` while its kept
line lasts (`NodeFit.lines`: slope -1 while the job it waits for is within its estimate, 0
on the Lindy floor or a fixed forecast, +1 past it). Within one slope the nodes' fits keep
their order as time passes, so each slope has its own list sorted by intercept, and the
soonest fit at `t` is the least of the three fronts. An entry stays true until
- an event changes the node's holders, free GPUs or its jobs' forecasts: the code that
  drops or marks the node's kept forecast (`core.model.state.set_holder`, `touch_job`,
  `core.model.scratch.forget_node`, a learned runtime of its jobs' team and kind) marks it
  in `Scratch.fit_dirty`, the next query hands it to every order, and the next query of
  an order makes its line there again;
- its line ends (`t` reaches the line's end): the `ends` heap yields it at that time.
Each change is paid once per order, at its next query (amortised over the events that
made it; an order no query reads pays nothing);
a query reads the fronts, skipping the few nodes held for other jobs. Time read back (a
drain hold worked out at the step before's time) falls back to reading every node.
"""

from __future__ import annotations

import bisect
import heapq

from ..model.cordon import takes_work
from ..model.state import State
from ..model.up_nodes import UpNodes
from .node_fit import NEVER, node_fit_ms

SLOPES = (-1, 0, 1)


class FitOrder:
    """The up nodes of one model with at least `need` GPUs, by when `need` GPUs fit there."""

    __slots__ = ("by_slope", "entry", "ends", "dirty")

    def __init__(self) -> None:
        # slope -> sorted [(intercept, name)]: the fit at t is intercept + slope * t
        self.by_slope: dict[int, list[tuple[int, str]]] = {slope: [] for slope in SLOPES}
        # name -> (slope, intercept, end) of its line, or None when it never fits
        self.entry: dict[str, tuple[int, int, int] | None] = {}
        self.ends: list[tuple[int, str]] = []  # (end of a line, name): a heap
        # The nodes whose fits changed since this order was last read (entered again then:
        # a node that changes many times between two reads is entered once).
        self.dirty: dict[str, None] = {}

    def put(self, state: State, node, need: int) -> None:
        """Enter the node's fit as its kept line says at the state's time (after `drop`)."""
        node_fit_ms(state, node, need)  # makes the kept line current at t
        intercept, slope, end = state.scratch.node_fits[node.name].lines[need]
        if slope is None:
            self.entry[node.name] = None
            return
        self.entry[node.name] = (slope, intercept, end)
        bisect.insort(self.by_slope[slope], (intercept, node.name))
        if end < NEVER:
            heapq.heappush(self.ends, (end, node.name))

    def drop(self, name: str) -> None:
        """Take the node out (its fit changed, or it left the order)."""
        entry = self.entry.pop(name, None)
        if entry is None:
            return
        slope, intercept, _ = entry
        items = self.by_slope[slope]
        i = bisect.bisect_left(items, (intercept, name))
        del items[i]

    def ended(self, t: int) -> list[str]:
        """The nodes whose lines end by `t` (their entries no longer tell)."""
        ends = self.ends
        names = []
        while ends and ends[0][0] <= t:
            end, name = heapq.heappop(ends)
            entry = self.entry.get(name)
            if entry is not None and entry[2] == end:
                names.append(name)
        return names

    def soonest(self, t: int, excluded) -> tuple[int, str] | None:
        """The least (wait, name) at `t` among the nodes not in `excluded`."""
        best = None
        for slope, items in self.by_slope.items():
            for intercept, name in items:
                if name in excluded:
                    continue
                candidate = (intercept + slope * t, name)
                if best is None or candidate < best:
                    best = candidate
                break
        return best


def ordered_single_fit(state: State, nodes: UpNodes, need: int) -> tuple[bool, tuple[int, list[str]] | None]:
    """(True, `earliest_single_fit(state, nodes, need)`) read from the kept orders; (False,
    None) when they cannot answer (the time was read back), and the caller reads every node."""
    sx = state.scratch
    t = state.canonical.t
    if t < sx.fit_order_t:
        return False, None
    sx.fit_order_t = t
    _hand_out_dirty(sx)
    best = None
    for model in nodes.models:
        order = sx.fit_orders.get((model, need))
        if order is None:
            order = sx.fit_orders[(model, need)] = _made(state, model, need)
        else:
            _bring_up_to_date(state, order, model, need, t)
        candidate = order.soonest(t, nodes.excluded)
        if candidate is not None and (best is None or candidate < best):
            best = candidate
    return True, None if best is None else (best[0], [best[1]])


def _made(state: State, model: str, need: int) -> FitOrder:
    order = FitOrder()
    nodes = state.canonical.nodes
    for name in state.index.up_nodes_by_model.get(model, ()):
        node = nodes[name]
        if node.gpus >= need:
            order.put(state, node, need)
    return order


def _hand_out_dirty(sx) -> None:
    """The nodes whose fits changed since the last query, to every kept order (each enters
    them again when it is next read)."""
    dirty = sx.fit_dirty
    if dirty:
        for order in sx.fit_orders.values():
            order.dirty.update(dirty)
        dirty.clear()


def _bring_up_to_date(state: State, order: FitOrder, model: str, need: int, t: int) -> None:
    """Enter again the order's nodes whose fits changed since it was last read and those
    whose lines have ended by `t`."""
    nodes = state.canonical.nodes
    again = [name for name in order.dirty if name in order.entry or _belongs(nodes.get(name), model, need)]
    again += order.ended(t)
    for name in sorted(dict.fromkeys(again)):
        order.drop(name)
        node = nodes.get(name)
        if _belongs(node, model, need):
            order.put(state, node, need)
    order.dirty.clear()


def _belongs(node, model: str, need: int) -> bool:
    return node is not None and takes_work(node) and node.gpu_model == model and node.gpus >= need
