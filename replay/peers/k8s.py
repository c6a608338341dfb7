"""Kubernetes-style priority preemption, after kube-scheduler's DefaultPreemption plugin.

- Levels map to PriorityClasses (level 0 highest); `preemptionPolicy:
  PreemptLowerPriority`, so any job may preempt strictly lower-priority jobs.
- Scheduling is the `none` policy's greedy pass (pods in priority order, each one that
  fits is bound). A pod that fits nowhere runs PostFilter: on each node, remove every
  lower-priority pod; if the job then fits, reprieve victims, most important first
  (higher priority, then earlier start), while it still fits. Among candidate nodes,
  pick (as pickOneNodeForPreemption): the lowest highest-victim priority, then the
  smallest sum of victim priorities, then the fewest victims, then the latest start of
  the highest-priority victims, then the node name.
- Victims are deleted gracefully: SIGTERM, `grace_s` (terminationGracePeriodSeconds,
  default 30 s), then SIGKILL, with no regard to checkpoints: a victim loses its
  progress since its last periodic checkpoint. Its Job controller recreates the pod,
  queued at the back of its priority; the training script resumes from its newest
  checkpoint.
- The preemptor is nominated to the node (nominatedNodeName): the GPUs it will use are
  held for it (here: strictly) and it binds there once the victims are gone.
- Assumption: kube-scheduler has no gang scheduling; a job larger than a node is
  handled as if by a coscheduling plugin: whole-node victim sets on the nodes with the
  lowest-priority victims and most reclaimable GPUs, reprieve on the last one.
"""

from __future__ import annotations

from .base import (
    PeerJob,
    best_single_node,
    gpus_on,
    rank_nodes,
    take_across_nodes,
    victims_on_node,
)
from .none import NonePolicy

DEFAULT_GRACE_S = 30.0


class K8sPolicy(NonePolicy):
    """Kubernetes-style priority preemption (see the module docstring): greedy priority pass,
    PostFilter victims per node, graceful kills."""

    name = "k8s"
    preempts = True

    def __init__(self, config: dict, cluster, seed: int) -> None:
        unknown = sorted(set(config) - {"grace_s"})
        if unknown:
            raise ValueError(f"k8s policy: unknown setting(s) {', '.join(unknown)}; known: grace_s")
        super().__init__(config, cluster, seed)
        self.grace_ms = int(1000 * float(config.get("grace_s", DEFAULT_GRACE_S)))

    def _node_victims(self, node: str, job: PeerJob, need: int) -> list[PeerJob] | None:
        candidates, lower = victims_on_node(self, node, job)
        capacity = self.pool.avail(node) + lower
        if capacity < need:
            return None
        victims = []
        for v in sorted(candidates, key=lambda v: (v.level, v.start_t, v.seq)):
            g = gpus_on(v, node)
            if capacity - g >= need:
                capacity -= g  # reprieved
            else:
                victims.append(v)
        return victims

    def _single_node(self, job: PeerJob):
        return best_single_node(self, job, self._node_victims, _node_key)

    def _across_nodes(self, job: PeerJob):
        return take_across_nodes(job, rank_nodes(self, job, _top_victim_rank), self._node_victims)


def _node_key(victims: list[PeerJob], node: str) -> tuple:
    """pickOneNodeForPreemption's order, smallest best."""
    top = min(v.level for v in victims)
    return (
        -top,
        sum(7 - v.level for v in victims),
        len(victims),
        -min(v.start_t for v in victims if v.level == top),
        node,
    )


def _top_victim_rank(candidates: list[PeerJob]) -> int:
    """Smallest for the node whose most important possible victim matters least."""
    return -min((v.level for v in candidates), default=8)
