"""Discrete-event simulator: a workload, a cluster and one scheduling policy on a virtual
clock, with a model of the hosts and the jobs on them.

Use from code:

    from replay.sim import simulate, Cluster
    from replay.workload import load_trace
    result = simulate(load_trace("philly", seed=0), Cluster.uniform(512), "xirang", {}, seed=0)
    # result.jobs: one JobOutcome per job; replay.scorecard.scorecard([result, ...]) sums up.

`simulate(workload, cluster, policy_name, policy_config, seed, progress=None)` builds the
policy named in `replay.peers.POLICIES` ("none", "k8s", "slurm", "xirang") with
`policy_config` (a dict of that policy's knobs; for "xirang" the keys of `core.Policy`,
or `{"policy": core.Policy}`) and runs until every job has finished or nothing is left to
happen. `progress(done_jobs, total_jobs, sim_t_ms)` is called now and then.

The clock jumps from one due moment to the next (a heap of (t, seq) entries): a trace
arrival, a host timer (a launch completing, a checkpoint finishing, a job ending, a
safe point), a fact reaching the scheduler, or a policy's wake-up (for xirang:
`core.next_due_t`, and a re-evaluation tick every `replay.peers.xirang.TICK_MS` while jobs wait).
Nothing ticks once a second.

The hosts and the jobs on them are `replay.simhost.SimHosts` (the one simulated host:
its docstring has the job model and what counts as lost GPU-time); `Simulator` adds the
workload's arrivals and the policy that decides.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable

from .simhost import HostJob, HostLatency, JobOutcome, SimError, SimHosts
from .workload import TraceJob, Workload

__all__ = ["Cluster", "HostLatency", "JobOutcome", "SimError", "SimResult", "Simulator", "simulate"]

PROGRESS_EVERY_JOBS = 500
# ... and every so many events, so the bar moves (and the clock shows) while few jobs end.
PROGRESS_EVERY_EVENTS = 20_000


@dataclass(frozen=True)
class Cluster:
    """The simulated pool: its nodes as (name, GPU model, GPUs)."""

    nodes: tuple[tuple[str, str, int], ...]  # (name, gpu model, gpus)

    @classmethod
    def uniform(cls, gpus_total: int, node_gpus: int = 8, models: tuple[str, ...] = ("V100",)) -> "Cluster":
        """`gpus_total` GPUs on nodes of `node_gpus`; models are assigned to nodes in turn."""
        if gpus_total <= 0 or node_gpus <= 0:
            raise ValueError("gpus and GPUs per node must be positive")
        if gpus_total % node_gpus:
            raise ValueError(f"{gpus_total} GPUs do not split into nodes of {node_gpus}")
        count = gpus_total // node_gpus
        width = len(str(count - 1))
        return cls(tuple((f"n{i:0{width}d}", models[i % len(models)], node_gpus) for i in range(count)))

    @property
    def total_gpus(self) -> int:
        """GPUs in the pool."""
        return sum(n[2] for n in self.nodes)

    @property
    def models(self) -> list[str]:
        """The pool's GPU models, sorted."""
        return sorted({n[1] for n in self.nodes})


@dataclass
class SimResult:
    """One policy's run of a workload: every job's outcome, the simulated span and what it cost
    to compute."""

    policy: str
    workload: str
    seed: int
    total_gpus: int
    jobs: list[JobOutcome]
    end_ms: int
    wall_s: float
    steps: int  # scheduler decisions made (for xirang: core.step calls)
    events: int  # simulator events processed
    extra: dict = field(default_factory=dict)


class Simulator(SimHosts):
    """The simulated hosts plus the workload's arrivals and the policy that decides: the
    policy acts through the hosts' commands (`start`, `notify`, `withdraw`, `kill`,
    `cancel`), hears their facts in `on_fact`, and asks to be woken with `wake_at`."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        policy,
        latency: HostLatency | None = None,
        progress: Callable | None = None,
    ) -> None:
        super().__init__(latency, policy.on_fact, policy.wants_periodic_checkpoints)
        self.workload = workload
        self.cluster = cluster
        self.policy = policy
        self.progress = progress
        self._wake_t: int | None = None
        self._last_progress = 0

    def wake_at(self, t: int) -> None:
        """Ask for `policy.on_wake(t)`; only the earliest pending request is kept."""
        t = max(t, self.now)
        if self._wake_t is not None and self._wake_t <= t:
            return
        self._wake_t = t
        self._push(t, self._wake, t)

    def _wake(self, t: int) -> None:
        if self._wake_t != t:
            return
        self._wake_t = None
        self.policy.on_wake(t)

    def run(self) -> None:
        """Every job arrives, runs and ends (or nothing is left to happen)."""
        for spec in self.workload.jobs:
            self.add_job(spec)
        self.policy.bind(self)
        arrivals = iter(self.workload.jobs)
        self._push_next_arrival(arrivals)
        heap = self._heap
        self._report_progress(force=True)  # started: the bar shows it at once
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
            if self.finished == len(self.jobs):
                break
            if self.events % PROGRESS_EVERY_EVENTS == 0:
                self._report_progress(force=True)
        self._report_progress(force=True)

    def _push_next_arrival(self, arrivals) -> None:
        spec = next(arrivals, None)
        if spec is not None:
            self._push(spec.submit_ms, self._arrive, spec, arrivals)

    def _arrive(self, spec: TraceJob, arrivals) -> None:
        self._push_next_arrival(arrivals)
        self.policy.on_submit(spec, self.now)

    def job_finished(self, job: HostJob) -> None:
        """A job ended: maybe move the progress bar."""
        self._report_progress()

    def _report_progress(self, force: bool = False) -> None:
        if self.progress is None:
            return
        if force or self.finished - self._last_progress >= PROGRESS_EVERY_JOBS:
            self._last_progress = self.finished
            self.progress(self.finished, len(self.jobs), self.now)


def simulate(
    workload: Workload,
    cluster: Cluster,
    policy_name: str,
    policy_config: dict | None = None,
    seed: int = 0,
    progress: Callable | None = None,
    latency: HostLatency | None = None,
) -> SimResult:
    """Run `workload` on `cluster` under the policy named `policy_name` to the end."""
    from .peers import make_policy

    policy = make_policy(policy_name, policy_config or {}, cluster, seed)
    sim = Simulator(workload, cluster, policy, latency, progress)
    began = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - began
    return SimResult(
        policy=policy_name,
        workload=workload.name,
        seed=seed,
        total_gpus=cluster.total_gpus,
        jobs=[sim.jobs[spec.id].out for spec in workload.jobs],
        end_ms=sim.now,
        wall_s=wall,
        steps=policy.steps,
        events=sim.events,
        extra=policy.summary(),
    )
