"""The inputs that cordon and uncordon a node: a host's report of its own health
(`node_health`) and an operator's `cordon` / `uncordon`. Each is checked (a bad one gets
`InputRejected` with what to fix) and turned into `NodeCordoned` / `NodeUncordoned`;
what a cordon keeps off the node is in core/model/cordon.py.

A node that reports itself unhealthy is cordoned by itself, and uncordoned when it reports
healthy again. An operator's cordon is the operator's to lift: the node's own reports
neither lift it nor replace its reason, and it outlasts a restart of the node. An
operator's uncordon lifts any cordon (a node still unhealthy refuses new runs itself).
Which node a host may report on is core/identity.py's to check: only its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .log.seal import Ctx, reject
from .model import types as T
from .model.cordon import HOST_PREFIX, OPERATOR_PREFIX
from .model.entities import Node

UNHEALTHY_WORDS = "the node reports itself unhealthy"


def _node_or_reject(ctx: Ctx, name: str) -> Node | None:
    node = ctx.state.canonical.nodes.get(name)
    if node is None:
        reject(ctx, "unknown_node", f"no node {name!r} has joined the pool (`xirang nodes` lists them)")
    return node


def _operator(inp: T.CordonNode | T.UncordonNode) -> str:
    """Who asks: the operator the bus authenticated (`op:<user>`), else the name given."""
    if inp.origin.startswith(OPERATOR_PREFIX):
        return inp.origin
    return OPERATOR_PREFIX + (inp.by or "operator")


def _on_node_health(ctx: Ctx, inp: T.NodeHealth) -> None:
    node = _node_or_reject(ctx, inp.node)
    if node is None:
        return
    if not node.up:
        return reject(ctx, "unknown_node", f"{inp.node} is not up: its node_up comes first")
    own = HOST_PREFIX + node.name
    if not inp.healthy:
        if node.cordoned_by:
            return  # cordoned already (by itself, or by an operator, whose cordon it stays)
        ctx.emit(T.NodeCordoned(t=inp.t, node=node.name, by=own, reason=inp.reason or UNHEALTHY_WORDS))
    elif node.cordoned_by == own:
        ctx.emit(T.NodeUncordoned(t=inp.t, node=node.name, by=own))


def _on_cordon(ctx: Ctx, inp: T.CordonNode) -> None:
    node = _node_or_reject(ctx, inp.node)
    if node is None:
        return
    if not inp.reason.strip():
        return reject(
            ctx, "reason_must_be_set", "say why (`--reason TEXT`): it is told to whoever asks why a job waits"
        )
    by = _operator(inp)
    if (node.cordoned_by, node.cordon_reason) == (by, inp.reason):
        return  # said again: nothing changes, nothing is logged
    ctx.emit(T.NodeCordoned(t=inp.t, node=node.name, by=by, reason=inp.reason))


def _on_uncordon(ctx: Ctx, inp: T.UncordonNode) -> None:
    node = _node_or_reject(ctx, inp.node)
    if node is None:
        return
    if not node.cordoned_by:
        return reject(ctx, "node_not_cordoned", f"{node.name} is not cordoned: it takes new work already")
    ctx.emit(T.NodeUncordoned(t=inp.t, node=node.name, by=_operator(inp)))


NODE_HANDLERS: dict[type, Callable[[Ctx, Any], None]] = {
    T.NodeHealth: _on_node_health,
    T.CordonNode: _on_cordon,
    T.UncordonNode: _on_uncordon,
}
