"""Gang placement on the GPU pool: all of a job's GPUs or none.

A job that fits on one node goes on one node, best fit (the node left with the fewest free
GPUs, then the smallest name: the free-count buckets keep their names sorted). A job larger than any node of its models spans nodes of one
GPU model, taking the emptiest nodes first so that it uses as few as possible. Pure functions over
the node table and the free-count index.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .state import Index
from .entities import Canonical, Job, Node
from .types import ResumePoint, Slot


def acceptable_models(job_models: list[str], ix: Index) -> list[str]:
    """The job's models, or every model in the pool when it accepts any."""
    if job_models:
        return sorted(job_models)
    return sorted(ix.capacity_by_model)


def free_gpus(models: list[str], ix: Index) -> int:
    """Free GPUs on the nodes of these models."""
    return sum(ix.free_by_model.get(m, 0) for m in models)


def node_size_max(models: list[str], ix: Index) -> int:
    """GPUs of the largest node of these models (a job larger than it spans nodes)."""
    return max((ix.node_size_max_by_model.get(m, 0) for m in models), default=0)


NO_NODES: dict[str, int] = {}


def place(
    gpus: int,
    models: list[str],
    nodes: dict[str, Node],
    ix: Index,
    reserved: dict[str, int] = NO_NODES,
    ends_t: int = 0,
) -> list[Slot] | None:
    """A gang placement, or None. `reserved` maps nodes held for blocked jobs (the oldest
    starving one, the head of the serving order) to the time each is expected to start
    there: a job expected to end by then (`ends_t`) may still use them (backfill), others
    may not."""
    if free_gpus(models, ix) < gpus:
        return None
    blocked = {name: None for name, start_t in reserved.items() if ends_t > start_t} if reserved else NO_NODES
    if gpus <= node_size_max(models, ix):
        return _place_on_one_node(gpus, models, nodes, ix, blocked)
    return _place_across_nodes(gpus, models, nodes, ix, blocked)


def _place_on_one_node(
    gpus: int, models: list[str], nodes: dict[str, Node], ix: Index, reserved: dict
) -> list[Slot] | None:
    best: tuple[int, str] | None = None
    for model in models:
        buckets = ix.free_buckets.get(model, {})
        for free in sorted(f for f in buckets if f >= gpus):
            # (A bucket's names are sorted: the first one not held is its smallest.)
            name = next((name for name in buckets[free] if name not in reserved), None)
            if name is not None:
                if best is None or (free, name) < best:
                    best = (free, name)
                break
    if best is None:
        return None
    node = nodes[best[1]]
    return [Slot(node=node.name, gpus=free_indices(node)[:gpus])]


def _place_across_nodes(
    gpus: int, models: list[str], nodes: dict[str, Node], ix: Index, reserved: dict
) -> list[Slot] | None:
    """A gang is of one GPU model: try each model, keep the one that needs fewest nodes."""
    best: tuple[int, str, list[Slot]] | None = None
    for model in models:
        if ix.free_by_model.get(model, 0) < gpus:
            continue
        buckets = ix.free_buckets.get(model, {})
        # The emptiest nodes first, then by name (a bucket's names are sorted).
        candidates = (
            (free, name)
            for free in sorted((f for f in buckets if f > 0), reverse=True)
            for name in buckets[free]
            if name not in reserved
        )
        placement: list[Slot] = []
        needed = gpus
        for free, name in candidates:
            take = min(free, needed)
            placement.append(Slot(node=name, gpus=free_indices(nodes[name])[:take]))
            needed -= take
            if needed == 0:
                break
        if needed == 0 and (best is None or (len(placement), model) < best[:2]):
            best = (len(placement), model, sorted(placement, key=lambda s: s.node))
    return None if best is None else best[2]


def free_indices(node: Node) -> list[int]:
    """The indices of the node's free GPUs."""
    return [i for i, holder in enumerate(node.holder) if holder == ""]


def placement_nodes(placement: list[Slot]) -> list[str]:
    """The nodes of a placement, in its order."""
    return sorted(dict.fromkeys(slot.node for slot in placement))


def run_details(c: Canonical, job: Job, nodes: list[str]) -> dict[str, Any]:
    """What every part of a run is told besides its GPUs: the advertised addresses of its
    `nodes` (in their order; [] when none advertised one) and the job's own preemption
    contract; the verified copies its SDK checkpoints need (`checkpoint_copies`); the
    policy's cap on the output each part keeps, when it sets one."""
    addrs = [c.nodes[name].addr if name in c.nodes else "" for name in nodes]
    details: dict[str, Any] = {
        "addrs": addrs if any(addrs) else [],
        "preempt_signal": job.preempt_signal,
        "grace_s": job.grace_ms / 1000,
        "ckpt_copies": c.policy.checkpoint_copies,
    }
    if c.policy.job_output_max_mb > 0:
        details["output_max_bytes"] = int(c.policy.job_output_max_mb * 2**20)
    return details


def resume_points(job: Job) -> list[ResumePoint]:
    """The job's checkpoints that name where they lie, newest first."""
    return [
        ResumePoint(step=ck.step, digest=ck.digest, path=ck.path, node=ck.node or msgspec.UNSET)
        for ck in reversed(job.checkpoints)
        if ck.path
    ]


def placement_gpus(placement: list[Slot]) -> int:
    """How many GPUs a placement holds."""
    return sum(len(slot.gpus) for slot in placement)


def gpus_on(job: Job, node_name: str) -> list[int]:
    """The GPUs a holding job has on one node (none if it has none there)."""
    for slot in job.placement:
        if slot.node == node_name:
            return slot.gpus
    return []
