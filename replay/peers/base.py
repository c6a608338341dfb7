"""What the peer policies share: their own view of the GPU pool, job records, the
preemption skeleton (how many GPUs each level could give up, evicting the victims a
policy chooses, holding their GPUs for the preemptor until it can start), and the
simulator-facing interface every policy (xirang's adapter too) implements:

    name: str; steps: int; wants_periodic_checkpoints: bool
    bind(sim)                 # the Simulator, whose commands (start, notify, withdraw,
                              # kill, cancel) act on hosts and whose wake_at(t) calls back
    on_submit(spec, t)        # a trace arrival (replay.workload.TraceJob)
    on_fact(inp)              # a host's fact, as a core input (Started, Finished, Released...)
    on_wake(t)                # the wake-up asked for with sim.wake_at
    summary() -> dict         # extra numbers for the scorecard

A peer learns that GPUs are free only from the facts (`finished`, `released`), as a real
scheduler would. Placement is the same as core's (placement.py): a job that fits one node
goes on one node, best fit (fewest free GPUs left, then the smallest name); a larger job
spans the emptiest nodes. So differences between policies come from their decisions, not
from packing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core import types as T

from ..workload import TraceJob

QUEUED = "queued"
NOMINATED = "nominated"  # victims are being evicted for it; GPUs reserved
STARTING = "starting"
RUNNING = "running"
TERMINATING = "terminating"


@dataclass(slots=True)
class PeerJob:
    """A peer policy's record of one job: its place in the queue, its state and where it runs or
    is nominated to run."""

    spec: TraceJob
    level: int
    eligible_t: int
    seq: int
    state: str = QUEUED
    placement: list = field(default_factory=list)  # [(node, gpus)]
    reservation: list = field(default_factory=list)  # [(node, gpus)] while NOMINATED
    start_t: int = -1
    cls: tuple = ()

    @property
    def id(self) -> str:
        """The job's id."""
        return self.spec.id

    @property
    def gpus(self) -> int:
        """GPUs the job needs."""
        return self.spec.gpus


class Pool:
    """Free and reserved GPUs per node, and the jobs bound to each node."""

    def __init__(self, cluster) -> None:
        self.names = [n[0] for n in cluster.nodes]
        self.model = {n[0]: n[1] for n in cluster.nodes}
        self.size = {n[0]: n[2] for n in cluster.nodes}
        self.free = {n[0]: n[2] for n in cluster.nodes}
        self.reserved = {n[0]: 0 for n in cluster.nodes}
        self.bound: dict[str, dict[str, int]] = {n[0]: {} for n in cluster.nodes}
        self.free_total = cluster.total_gpus
        self.reserved_total = 0
        self.node_gpus_max = max(self.size.values())

    def nodes_for(self, models: list[str]) -> list[str]:
        """The nodes of these GPU models (every node when the job names none)."""
        if not models:
            return self.names
        return [n for n in self.names if self.model[n] in models]

    def avail(self, node: str) -> int:
        """GPUs of the node neither used nor reserved."""
        return self.free[node] - self.reserved[node]

    def place(self, gpus: int, models: list[str]) -> list[tuple[str, int]] | None:
        """Where `gpus` GPUs of these models fit now, as core places them ([(node, gpus)]), or
        None."""
        if self.free_total - self.reserved_total < gpus:
            return None
        nodes = self.nodes_for(models)
        free, reserved = self.free, self.reserved
        if gpus <= self.node_gpus_max:
            best = None
            best_avail = 1 << 30
            for n in nodes:
                a = free[n] - reserved[n]
                if gpus <= a < best_avail:
                    best, best_avail = n, a
                    if a == gpus:
                        break
            return None if best is None else [(best, gpus)]
        order = sorted((-self.avail(n), n) for n in nodes if self.avail(n) > 0)
        placement, need = [], gpus
        for neg, n in order:
            take = min(-neg, need)
            placement.append((n, take))
            need -= take
            if need == 0:
                return sorted(placement)
        return None

    def occupy(self, job_id: str, placement: list[tuple[str, int]]) -> None:
        """The job takes the GPUs of its placement."""
        for n, g in placement:
            self.free[n] -= g
            self.free_total -= g
            self.bound[n][job_id] = g

    def vacate(self, job_id: str, placement: list[tuple[str, int]]) -> None:
        """The job's GPUs are free again."""
        for n, g in placement:
            self.free[n] += g
            self.free_total += g
            self.bound[n].pop(job_id, None)

    def reserve(self, reservation: list[tuple[str, int]], sign: int = 1) -> None:
        """Hold (`sign` 1) or let go (-1) of GPUs for a nominated job."""
        for n, g in reservation:
            self.reserved[n] += sign * g
            self.reserved_total += sign * g


class PeerPolicy:
    """Common bookkeeping: job records, the pool, facts, starting jobs, and the preemption
    skeleton. A policy that preempts sets `preempts` and `grace_ms` and chooses its
    victims in `_single_node` and `_across_nodes`; the skeleton does the rest."""

    name = "peer"
    wants_periodic_checkpoints = False
    preempts = False
    grace_ms = 0

    def __init__(self, config: dict, cluster, seed: int) -> None:
        self.config = dict(config)
        self.cluster = cluster
        self.pool = Pool(cluster)
        self.jobs: dict[str, PeerJob] = {}
        self.bound_jobs: dict[str, PeerJob] = {}  # holding GPUs (starting, running, leaving)
        self.steps = 0
        # Bumped whenever a job takes or leaves GPUs, or stops being a possible victim:
        # a preemption search that failed stays failed until it changes.
        self.version = 0
        self._no_victims: dict[tuple, int] = {}
        self.level_gpus = [0] * 8  # GPUs bound to evictable (starting/running) jobs per level
        self.nominated: dict[str, PeerJob] = {}
        self.preemptions = 0
        self._seq = 0
        self.sim = None

    def bind(self, sim) -> None:
        """Attach to the simulator whose commands the policy uses."""
        self.sim = sim

    def summary(self) -> dict:
        """Extra numbers for the scorecard."""
        return {"preemptions_decided": self.preemptions}

    # ------------------------------------------------------------ arrivals and facts

    def on_submit(self, spec: TraceJob, t: int) -> None:
        """A trace arrival: queue the job and ask for a scheduling pass now."""
        self._seq += 1
        job = PeerJob(spec=spec, level=spec.level, eligible_t=t, seq=self._seq)
        self.jobs[spec.id] = job
        self.enqueue(job)
        self.sim.wake_at(t)

    def on_fact(self, inp: T.Input) -> None:
        """A host's fact: a start is confirmed, a finished job frees its GPUs, a released victim
        frees them and goes back to the queue."""
        job = self.jobs.get(inp.job)
        if job is None:
            return
        self.version += 1
        if isinstance(inp, T.Started):
            job.state = RUNNING if job.state == STARTING else job.state
        elif isinstance(inp, T.Finished):
            self.pool.vacate(job.id, job.placement)
            self.bound_jobs.pop(job.id, None)
            del self.jobs[job.id]
            self.on_job_gone(job)
            self.sim.wake_at(inp.t)
        elif isinstance(inp, T.Released):  # a victim's process is gone: requeue it
            self.pool.vacate(job.id, job.placement)
            self.bound_jobs.pop(job.id, None)
            job.placement = []
            job.state = QUEUED
            self._seq += 1
            job.seq = self._seq
            job.eligible_t = inp.t
            self.on_job_gone(job)
            self.enqueue(job)
            self.sim.wake_at(inp.t)

    def on_job_gone(self, job: PeerJob) -> None:
        """A job left its GPUs (finished or evicted)."""
        # An evicted job left level_gpus when it was evicted; only a job that finished
        # while still evictable is counted out here.
        if job.state in (STARTING, RUNNING):
            self.level_gpus[job.level] -= job.gpus

    def preemption_known_futile(self, job: PeerJob) -> bool:
        """Whether a victim search for a job like this one already failed and nothing changed
        since."""
        return self._no_victims.get((job.level, job.gpus, tuple(job.spec.gpu_models))) == self.version

    def note_preemption_futile(self, job: PeerJob) -> None:
        """Remember that no victim set makes room for jobs like this one, until the pool
        changes."""
        self._no_victims[(job.level, job.gpus, tuple(job.spec.gpu_models))] = self.version

    # ------------------------------------------------------------ actions

    def start(self, job: PeerJob, placement: list[tuple[str, int]]) -> None:
        """Bind the job to `placement` and tell its hosts to start it (resuming from its newest
        checkpoint)."""
        self.version += 1
        self.pool.occupy(job.id, placement)
        self.bound_jobs[job.id] = job
        job.placement = placement
        job.state = STARTING
        job.start_t = self.sim.now
        self.sim.start(job.id, placement, None)
        self.level_gpus[job.level] += job.gpus

    def evict(self, victim: PeerJob, grace_ms: int) -> None:
        """Kill the victim with `grace_ms` to finish (its GPUs are free once it has released)."""
        self.level_gpus[victim.level] -= victim.gpus
        victim.state = TERMINATING
        self.version += 1
        self.preemptions += 1
        self.sim.kill(victim.id, grace_ms)

    def nominate(self, job: PeerJob, reservation: list[tuple[str, int]]) -> None:
        """Hold `reservation` for `job` until its victims are gone."""
        job.state = NOMINATED
        job.reservation = reservation
        self.pool.reserve(reservation)
        self.nominated[job.id] = job

    def start_nominated(self, order_key) -> None:
        """Start each nominated job whose reserved GPUs have all been freed, in
        `order_key(job)` order."""
        if not self.nominated:
            return
        for job in sorted(self.nominated.values(), key=order_key):
            if all(self.pool.free[n] >= g for n, g in job.reservation):
                self.pool.reserve(job.reservation, -1)
                del self.nominated[job.id]
                reservation, job.reservation = job.reservation, []
                self.start(job, reservation)

    # ------------------------------------------------------------ preemption

    def evict_to_place(self, job: PeerJob) -> bool:
        """Evict the victims the policy chooses for `job` and nominate it to their GPUs;
        False, evicting nothing, when no choice of victims makes room."""
        if self.preemption_known_futile(job) or not self._room_below(job):
            return False
        if job.gpus <= self.pool.node_gpus_max:
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

    def _room_below(self, job: PeerJob) -> bool:
        # A pool-wide bound, cheap next to the per-node search: if evicting every
        # lower-priority job would not free enough GPUs, no victim set will.
        lower = sum(self.level_gpus[job.level + 1 :])
        return lower + self.pool.free_total - self.pool.reserved_total >= job.gpus

    # ------------------------------------------------------------ to implement

    def enqueue(self, job: PeerJob) -> None:
        """Put a job in the policy's queue (on arrival or after eviction)."""
        raise NotImplementedError

    def on_wake(self, t: int) -> None:
        """A scheduling pass at time `t`."""
        raise NotImplementedError

    def _single_node(self, job: PeerJob) -> tuple[list[PeerJob], list] | None:
        """Victims and a one-node reservation for a job that fits a node, or None."""
        raise NotImplementedError

    def _across_nodes(self, job: PeerJob) -> tuple[list[PeerJob], list] | None:
        """Victims and a reservation over several nodes for a larger gang, or None."""
        raise NotImplementedError


def victims_on_node(policy: PeerPolicy, node: str, preemptor: PeerJob) -> tuple[list[PeerJob], int]:
    """Bound jobs of strictly lower priority (higher level) that are not already leaving,
    and the GPUs they hold on this node."""
    out = []
    gpus = 0
    jobs = policy.jobs
    level = preemptor.level
    for job_id, held in policy.pool.bound[node].items():
        job = jobs[job_id]
        if job.level > level and (job.state == RUNNING or job.state == STARTING):
            out.append(job)
            gpus += held
    return out, gpus


def gpus_on(job: PeerJob, node: str) -> int:
    """GPUs the job holds on `node`."""
    for n, g in job.placement:
        if n == node:
            return g
    return 0


def best_single_node(
    policy: PeerPolicy, job: PeerJob, node_victims, node_key
) -> tuple[list[PeerJob], list] | None:
    """Among the nodes large enough for `job` where `node_victims(node, job, gpus)` makes
    room by evicting someone, the one with the smallest `node_key(victims, node)`: its
    victims and reservation, or None."""
    best = None
    for node in policy.pool.nodes_for(job.spec.gpu_models):
        if policy.pool.size[node] < job.gpus:
            continue
        victims = node_victims(node, job, job.gpus)
        if not victims:
            continue
        key = node_key(victims, node)
        if best is None or key < best[0]:
            best = (key, victims, [(node, job.gpus)])
    return None if best is None else (best[1], best[2])


def rank_nodes(policy: PeerPolicy, job: PeerJob, node_rank) -> list[tuple]:
    """The nodes that could give `job` GPUs, free or held by its possible victims, as
    (node_rank(those victims), -capacity, node), best first: the input of take_across_nodes."""
    ranked = []
    for node in policy.pool.nodes_for(job.spec.gpu_models):
        candidates, lower = victims_on_node(policy, node, job)
        capacity = policy.pool.avail(node) + lower
        if capacity > 0:
            ranked.append((node_rank(candidates), -capacity, node))
    ranked.sort()
    return ranked


def take_across_nodes(job: PeerJob, ranked: list[tuple], node_victims) -> tuple[list[PeerJob], list] | None:
    """Fill a gang larger than a node from `ranked` (key, -capacity, node) entries in order,
    collecting each node's victims; None if the gang cannot be filled or needs no victim."""
    victims: dict[str, PeerJob] = {}
    reservation = []
    need = job.gpus
    for _, neg_capacity, node in ranked:
        take = min(-neg_capacity, need)
        for v in node_victims(node, job, take) or []:
            victims[v.id] = v
        reservation.append((node, take))
        need -= take
        if need == 0:
            break
    if need > 0 or not victims:
        return None
    return list(victims.values()), sorted(reservation)
