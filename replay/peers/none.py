"""No preemption: strict priority (level 0 first), first come first served within a level.

This is kube-scheduler with `preemptionPolicy: Never`: every scheduling pass walks the
pending jobs in priority order and starts each one that fits now. A job that does not fit
is skipped and jobs behind it may start (greedy backfill with no reservation), so a
large job can wait a long time behind a stream of small ones; nothing running is ever
stopped. A requeued job (never, here) would go to the back of its level.

The pass walks per-(level, GPUs, models) FIFO classes merged by (level, eligible time,
arrival): jobs of one class are interchangeable for fitting, so once the head of a class
cannot be placed the rest of that class is skipped for this pass. That keeps a pass
proportional to the jobs started, not to the queue length.
"""

from __future__ import annotations

import heapq

from .base import PeerJob, PeerPolicy


def rank(job: PeerJob) -> tuple:
    """Priority, then first come first served."""
    return (job.level, job.eligible_t, job.seq)


class NonePolicy(PeerPolicy):
    """Strict priority without preemption: each pass starts, in priority order, every job that
    fits now."""

    name = "none"

    def __init__(self, config: dict, cluster, seed: int) -> None:
        super().__init__(config, cluster, seed)
        self.classes: dict[tuple, dict[str, PeerJob]] = {}

    def enqueue(self, job: PeerJob) -> None:
        """Add the job to the FIFO class of its (level, GPUs, models)."""
        job.cls = (job.level, job.gpus, tuple(job.spec.gpu_models))
        self.classes.setdefault(job.cls, {})[job.id] = job

    def dequeue(self, job: PeerJob) -> None:
        """Take the job out of its class."""
        members = self.classes[job.cls]
        del members[job.id]
        if not members:
            del self.classes[job.cls]

    def on_wake(self, t: int) -> None:
        """One pass: start nominated jobs whose GPUs are free, then walk the classes in priority
        order, starting each head that fits."""
        self.steps += 1
        self.start_nominated(rank)
        heap = []
        for cls, members in self.classes.items():
            heap.append((rank(next(iter(members.values()))), cls))
        heapq.heapify(heap)
        while heap:
            if self.pool.free_total - self.pool.reserved_total <= 0 and not self.preempts:
                break
            _, cls = heapq.heappop(heap)
            members = self.classes[cls]
            job = next(iter(members.values()))
            placement = self.pool.place(job.gpus, job.spec.gpu_models)
            if placement is not None:
                self.dequeue(job)
                self.start(job, placement)
            elif self.preempts and self.evict_to_place(job):
                self.dequeue(job)
            else:
                continue  # the class is blocked for this pass
            if cls in self.classes:
                heapq.heappush(heap, (rank(next(iter(self.classes[cls].values()))), cls))
