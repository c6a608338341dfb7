"""Slurm-style scheduling: multifactor priority with an age factor, QOS preemption with
PreemptMode=REQUEUE and GraceTime, and EASY backfill.

Assumptions, with Slurm's names (defaults here in brackets; override in the config dict):
- Priority (priority/multifactor), recomputed every PriorityCalcPeriod [300 s] and at
  submit:  PriorityWeightAge [5000] * min(age, PriorityMaxAge [7 days]) / PriorityMaxAge
  + PriorityWeightQOS [10000] * (7 - level) / 7 + PriorityWeightPartition [1000] * 1
  (one partition). One level is worth 1429 points, about two days of age, so a job that
  has waited long enough overtakes newer jobs of the next level up. Fair-share, job size
  and association factors are left out (weight 0). Ties go to the older job id.
- The main scheduler tests pending jobs in priority order (at most default_queue_depth
  [100] per pass) and stops at the first job it can neither start nor start by
  preemption, like a single partition.
- Preemption (PreemptType=preempt/qos; preempt/none turns it off): a level may preempt
  jobs of any lower QOS
  (higher level), even one that has just started (PreemptExemptTime unset). Preemptable
  jobs on a node go lowest QOS first, then youngest; the
  node needing the fewest victims (then fewest victim GPUs, then name) wins. Victims get
  SIGTERM, GraceTime [60 s], then SIGKILL, and are requeued (PreemptMode=REQUEUE): the
  job restarts from its newest periodic checkpoint, losing the progress since, and its
  age restarts at the requeue (its eligible time is reset). The preemptor waits for the
  victims' GPUs, which are held for it.
- Backfill (sched/backfill) every bf_interval [30 s] while GPUs are free: the first
  blocked job gets a reservation at its shadow time, computed from running jobs' time
  limits (the trace's est_runtime_s, counted from their start); later jobs (at most
  bf_max_job_test [500]) start when they fit now and either end by the shadow time or
  use only GPUs the reservation does not need. Backfill does not preempt. The
  reservation counts GPUs pool-wide, not per node.
"""

from __future__ import annotations

import bisect

from .base import (
    PeerJob,
    PeerPolicy,
    best_single_node,
    gpus_on,
    rank_nodes,
    take_across_nodes,
    victims_on_node,
)

DAY_MS = 86_400_000
DEFAULTS = {
    "PriorityWeightAge": 5000.0,
    "PriorityMaxAge_s": 7 * 86400.0,
    "PriorityWeightQOS": 10000.0,
    "PriorityWeightPartition": 1000.0,
    "PriorityCalcPeriod_s": 300.0,
    "GraceTime_s": 60.0,
    "PreemptType": "preempt/qos",
    "default_queue_depth": 100,
    "bf_interval_s": 30.0,
    "bf_max_job_test": 500,
}


class SlurmPolicy(PeerPolicy):
    """Slurm-style scheduling (see the module docstring): multifactor priority with age, QOS
    preemption with requeue, EASY backfill."""

    name = "slurm"

    def __init__(self, config: dict, cluster, seed: int) -> None:
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise ValueError(
                f"slurm policy: unknown setting(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}"
            )
        super().__init__(config, cluster, seed)
        cfg = {**DEFAULTS, **config}
        self.w_age = float(cfg["PriorityWeightAge"])
        self.max_age_ms = int(1000 * float(cfg["PriorityMaxAge_s"]))
        self.w_qos = float(cfg["PriorityWeightQOS"])
        self.w_part = float(cfg["PriorityWeightPartition"])
        self.calc_ms = int(1000 * float(cfg["PriorityCalcPeriod_s"]))
        self.grace_ms = int(1000 * float(cfg["GraceTime_s"]))
        if cfg["PreemptType"] not in ("preempt/qos", "preempt/none"):
            raise ValueError("slurm policy: PreemptType must be preempt/qos or preempt/none")
        self.preempts = cfg["PreemptType"] == "preempt/qos"
        self.queue_depth = int(cfg["default_queue_depth"])
        self.bf_ms = int(1000 * float(cfg["bf_interval_s"]))
        self.bf_max = int(cfg["bf_max_job_test"])
        self.queue: list[tuple[float, int, int, str]] = []  # (-priority, eligible_t, seq, id)
        self.keys: dict[str, tuple] = {}
        self.next_calc_t = 0
        self.last_bf_t = -(10**18)
        self.arrivals = 0
        self._bf_idle_key: tuple = ()
        self._ends: list[tuple[int, int]] = []  # (`_ends_by_limit`)
        self._ends_version = -1

    # ------------------------------------------------------------ priority

    def priority(self, job: PeerJob, t: int) -> float:
        """The job's multifactor priority at `t`: age, QOS (its level) and partition."""
        age = min(max(0, t - job.eligible_t), self.max_age_ms)
        return self.w_age * age / self.max_age_ms + self.w_qos * (7 - job.level) / 7 + self.w_part

    def _key(self, job: PeerJob, t: int) -> tuple:
        return (-self.priority(job, t), job.eligible_t, job.seq, job.id)

    def enqueue(self, job: PeerJob) -> None:
        """Insert the job in priority order."""
        self.arrivals += 1
        key = self._key(job, self.sim.now)
        self.keys[job.id] = key
        bisect.insort(self.queue, key)

    def _dequeue_at(self, i: int) -> None:
        key = self.queue.pop(i)
        del self.keys[key[3]]

    def _recalc(self, t: int) -> None:
        self.queue = sorted(self._key(self.jobs[k[3]], t) for k in self.queue)
        self.keys = {k[3]: k for k in self.queue}
        self.next_calc_t = t + self.calc_ms

    # ------------------------------------------------------------ the passes

    def on_wake(self, t: int) -> None:
        """One pass: recompute priorities when due, start nominated jobs, the main scheduler,
        then backfill."""
        self.steps += 1
        if t >= self.next_calc_t:
            self._recalc(t)
        self.start_nominated(self._nominated_key)
        blocked_at = self._main(t)
        if blocked_at is not None and self.pool.free_total - self.pool.reserved_total > 0:
            # A backfill that started nothing starts nothing later either until jobs
            # arrive or GPUs change hands (time only brings the shadow time closer).
            if (self.version, self.arrivals) == self._bf_idle_key:
                return
            if t - self.last_bf_t >= self.bf_ms:
                self.last_bf_t = t
                if not self._backfill(t, blocked_at):
                    self._bf_idle_key = (self.version, self.arrivals)
                    return
            if self.pool.free_total - self.pool.reserved_total > 0:
                self.sim.wake_at(self.last_bf_t + self.bf_ms)

    def _main(self, t: int) -> int | None:
        """Start or preempt in priority order; the index of the first blocked job, or None."""
        i = 0
        tested = 0
        while i < len(self.queue) and tested < self.queue_depth:
            tested += 1
            job = self.jobs[self.queue[i][3]]
            placement = self.pool.place(job.gpus, job.spec.gpu_models)
            if placement is not None:
                self._dequeue_at(i)
                self.start(job, placement)
            elif self.preempts and self.evict_to_place(job):
                self._dequeue_at(i)
            else:
                return i
        return None

    def _backfill(self, t: int, head_i: int) -> bool:
        queue, jobs, pool = self.queue, self.jobs, self.pool
        head = jobs[queue[head_i][3]]
        shadow_t, extra = self._shadow(head, t)
        i = head_i + 1
        tested = 0
        # Placing only takes GPUs away, so a size that did not fit once in this pass
        # will not fit later in it (per set of acceptable models).
        smallest_unplaceable: dict[tuple, int] = {}
        started = False
        avail = pool.free_total - pool.reserved_total  # (changes only when a job starts)
        while i < len(queue) and tested < self.bf_max:
            if avail <= 0:
                return started
            job = jobs[queue[i][3]]
            spec = job.spec
            tested += 1
            gpus = spec.gpus
            if gpus > avail:
                i += 1
                continue
            models = tuple(spec.gpu_models)
            if gpus >= smallest_unplaceable.get(models, 1 << 30):
                i += 1
                continue
            ends_in_time = t + spec.est_runtime_ms <= shadow_t
            if not ends_in_time and gpus > extra:
                i += 1
                continue
            placement = pool.place(gpus, spec.gpu_models)
            if placement is None:
                smallest_unplaceable[models] = min(gpus, smallest_unplaceable.get(models, 1 << 30))
                i += 1
                continue
            if not ends_in_time:
                extra -= gpus
            self._dequeue_at(i)
            self.start(job, placement)
            avail = pool.free_total - pool.reserved_total
            started = True
        return started

    def _shadow(self, head: PeerJob, t: int) -> tuple[int, int]:
        """When the head job could start as running jobs reach their time limits, and how
        many GPUs it leaves spare then."""
        free = self.pool.free_total - self.pool.reserved_total
        # Running jobs' (time limit, GPUs), soonest first, kept while no job takes or
        # leaves GPUs; those already past their limit count as ending now, the smallest
        # first (as sorting them with their ends made `t` would order them).
        ends = self._ends_by_limit()
        past = bisect.bisect_right(ends, (t, 1 << 62))
        for gpus in sorted(gpus for _, gpus in ends[:past]):
            if free >= head.gpus:
                return t, max(0, free - head.gpus)
            free += gpus
        for end_t, gpus in ends[past:] if free < head.gpus else ():
            if free >= head.gpus:
                break
            free += gpus
            t = end_t
        return t, max(0, free - head.gpus)

    def _ends_by_limit(self) -> list[tuple[int, int]]:
        if self._ends_version != self.version:
            self._ends_version = self.version
            self._ends = sorted(
                (job.start_t + job.spec.est_runtime_ms, job.spec.gpus) for job in self.bound_jobs.values()
            )
        return self._ends

    def _nominated_key(self, job: PeerJob) -> tuple:
        # A nominated job has left the queue and with it its key, so in practice this
        # orders nominated jobs by seq (submit or requeue order).
        return self.keys.get(job.id, (0,)) + (job.seq,)

    # ------------------------------------------------------------ preemption

    def _node_victims(self, node: str, job: PeerJob, need: int) -> list[PeerJob] | None:
        have = self.pool.avail(node)
        candidates, lower = victims_on_node(self, node, job)
        if have + lower < need:
            return None
        victims = []
        for v in sorted(candidates, key=lambda v: (-v.level, -v.start_t, v.seq)):
            if have >= need:
                break
            victims.append(v)
            have += gpus_on(v, node)
        return victims if have >= need else None

    def _single_node(self, job: PeerJob):
        return best_single_node(
            self,
            job,
            self._node_victims,
            lambda victims, node: (len(victims), sum(v.gpus for v in victims), node),
        )

    def _across_nodes(self, job: PeerJob):
        return take_across_nodes(job, rank_nodes(self, job, len), self._node_victims)
