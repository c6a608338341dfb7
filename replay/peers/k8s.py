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

from .base import PeerJob, gpus_on, take_across_nodes, victims_on_node
from .none import NonePolicy

DEFAULT_GRACE_S = 30.0


class K8sPolicy(NonePolicy):
    name = "k8s"
    preempts = True

    def __init__(self, config: dict, cluster, seed: int) -> None:
        unknown = sorted(set(config) - {"grace_s"})
        if unknown:
            raise ValueError(f"k8s policy: unknown setting(s) {', '.join(unknown)}; known: grace_s")
        super().__init__(config, cluster, seed)
        self.grace_ms = int(1000 * float(config.get("grace_s", DEFAULT_GRACE_S)))
        self.level_gpus = [0] * 8  # GPUs bound to evictable (starting/running) jobs per level

    def start(self, job, placement) -> None:
        super().start(job, placement)
        self.level_gpus[job.level] += job.gpus

    def evict(self, victim, grace_ms) -> None:
        self.level_gpus[victim.level] -= victim.gpus
        super().evict(victim, grace_ms)

    def on_job_gone(self, job) -> None:
        if job.state in ("starting", "running"):  # finished while still evictable
            self.level_gpus[job.level] -= job.gpus

    def try_preempt(self, job: PeerJob) -> bool:
        need = job.gpus
        if self.preemption_known_futile(job):
            return False
        lower = sum(self.level_gpus[job.level + 1:])
        if lower + self.pool.free_total - self.pool.reserved_total < need:
            return False
        if need <= self.pool.node_gpus_max:
            choice = self._single_node(job)
        else:
            choice = self._across_nodes(job)
        if choice is None:
            self.note_preemption_futile(job)
            return False
        victims, reservation = choice
        for victim in victims:
            self.evict(victim, self.grace_ms)
        self.nominate(job, reservation)
        return True

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
        best = None
        for node in self.pool.nodes_for(job.spec.gpu_models):
            if self.pool.size[node] < job.gpus:
                continue
            victims = self._node_victims(node, job, job.gpus)
            if not victims:
                continue
            top = min(v.level for v in victims)
            key = (-top, sum(7 - v.level for v in victims), len(victims),
                   -min(v.start_t for v in victims if v.level == top), node)
            if best is None or key < best[0]:
                best = (key, victims, [(node, job.gpus)])
        return None if best is None else (best[1], best[2])

    def _across_nodes(self, job: PeerJob):
        ranked = []
        for node in self.pool.nodes_for(job.spec.gpu_models):
            candidates, lower = victims_on_node(self, node, job)
            capacity = self.pool.avail(node) + lower
            if capacity <= 0:
                continue
            top = min((v.level for v in candidates), default=8)
            ranked.append((-top, -capacity, node))
        ranked.sort()
        return take_across_nodes(job, ranked, self._node_victims)
