"""Whether new work may land on a node: the one rule that placement, reservations (node
holds) and the preemption scope all ask, and that the index of free GPUs is kept by (a node
that may not take work is not in it, so no placement can pick it).

A node takes new work while it is up and not cordoned. A cordon (`NodeCordoned`) comes from
the node itself, reporting itself unhealthy (`node_health`: its disk is almost full), or
from an operator (`xirang node cordon`, Slurm's drain); it keeps new jobs off the node and
keeps the scheduler from choosing preemption victims or reservations there, while the jobs
already running on it keep running and are managed as before.
"""

from __future__ import annotations

from .entities import Node

NODE_DOWN = "node_down"
NODE_CORDONED = "node_cordoned"
# `NodeCordoned.by` when the node reported itself unhealthy (the prefix of `host:<node>`).
HOST_PREFIX = "host:"
OPERATOR_PREFIX = "op:"


def schedulable(node: Node) -> tuple[bool, str]:
    """(whether new work may be placed on `node`, and if not the reason code: `node_down`
    or `node_cordoned`)."""
    if not node.up:
        return False, NODE_DOWN
    if node.cordoned_by:
        return False, NODE_CORDONED
    return True, ""


def takes_work(node: Node) -> bool:
    """`schedulable(node)`'s verdict alone, for the loops that only filter nodes."""
    return schedulable(node)[0]


def cordon_words(node: Node) -> str:
    """Who cordoned the node and why, in words (`h1 (by op:ana: disk swap)`)."""
    return f"{node.name} (by {node.cordoned_by}: {node.cordon_reason})"
