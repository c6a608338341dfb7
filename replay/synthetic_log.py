"""A realistic log for the projection tests, the dashboard and `xirang bench replay`: a
small seeded synthetic workload run through the simulator (`replay.sim`, the one simulated
host, with `core.step` deciding), every record the core seals kept in memory. It has
preemptions, requeues, compensation, aging and failed jobs, so every projection table fills
up; an optional preemption storm (a burst of urgent jobs from one team) exercises the
alerts.

    records = generate(Spec(jobs=150, seed=7)).records

Unlike `xirang sim` there are no baselines and no scorecard: only the log.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from core import types as T
from core.model.policy import Policy
from core.model.state import State

from .peers.xirang import XirangPolicy
from .sim import Cluster, SimResult, Simulator
from .workload import TraceJob, Workload

SEC = 1000
MIN = 60 * SEC
TEAMS = ("vision", "lm", "search", "safety")
LEVEL_WEIGHTS = (1, 2, 3, 6, 8, 10, 12, 10)  # few urgent jobs, many batch ones
GPU_MODEL = "A100"
FAILED_FRACTION = 0.03  # jobs whose process exits with an error at its end
CKPT_COST_MS = 20 * SEC
RESTORE_COST_MS = 15 * SEC


@dataclass
class Spec:
    """What to generate: arrivals, pool, an optional storm, and the policy in force."""

    seed: int = 7
    jobs: int = 200
    nodes: int = 6
    gpus_per_node: int = 8
    mean_gap_ms: int = 4 * MIN  # about 90% of a 48-GPU pool busy
    duration_ms: tuple[int, int] = (10 * MIN, 90 * MIN)
    storm_t: int | None = None  # when a burst of urgent jobs arrives
    storm_jobs: int = 0
    storm_level: int = 1
    storm_gpus: int = 2
    storm_team: str = "storm"
    policy: Policy | None = None  # recorded at the log's start as a set_policy
    extra_inputs: list[T.Input] = field(default_factory=list)  # e.g. set_policy at a time


@dataclass
class Generated:
    """The run: the core's records (the log), its final state and the simulator's result."""

    records: list[T.Record]
    state: State
    result: SimResult


def workload(spec: Spec) -> Workload:
    """The spec's jobs, in arrival order: Poisson arrivals at every level, then the storm."""
    rng = random.Random(spec.seed)
    jobs: list[TraceJob] = []
    t = SEC
    for i in range(spec.jobs):
        t += int(rng.expovariate(1 / spec.mean_gap_ms))
        level = rng.choices(range(T.LEVELS), weights=LEVEL_WEIGHTS)[0]
        team = rng.choice(TEAMS)
        user = f"{team}-u{rng.randint(1, 3)}"
        jobs.append(_job(rng, spec, t, f"{team}-{i:05d}", team, user, level))
    if spec.storm_t is not None:
        for i in range(spec.storm_jobs):
            jobs.append(
                _job(
                    rng,
                    spec,
                    spec.storm_t + i * SEC,
                    f"{spec.storm_team}-{i:03d}",
                    spec.storm_team,
                    f"{spec.storm_team}-u{i % 3 + 1}",
                    spec.storm_level,
                    gpus=spec.storm_gpus,
                )
            )
    jobs.sort(key=lambda job: job.submit_ms)  # stable: ties keep their order
    return Workload(name=f"synthetic[seed={spec.seed}]", jobs=jobs, seed=spec.seed)


def _job(
    rng: random.Random, spec: Spec, t: int, job: str, team: str, user: str, level: int, gpus: int = 0
) -> TraceJob:
    gpus = gpus or rng.choice((1, 2, 4, 4, 8))
    duration = rng.randint(*spec.duration_ms)
    ckpt = rng.choice((5, 10, 20)) * MIN
    return TraceJob(
        id=job,
        submit_ms=t,
        duration_ms=duration,
        gpus=gpus,
        team=team,
        user=user,
        level=level,
        gpu_models=[GPU_MODEL],
        ckpt_interval_ms=ckpt,
        ckpt_cost_ms=CKPT_COST_MS,
        restore_cost_ms=RESTORE_COST_MS,
        est_runtime_ms=duration,
        fails=rng.random() < FAILED_FRACTION,
    )


def cluster(spec: Spec) -> Cluster:
    """`nodes` nodes `node-00`.. of `gpus_per_node` A100s."""
    return Cluster(tuple((f"node-{i:02d}", GPU_MODEL, spec.gpus_per_node) for i in range(spec.nodes)))


def generate(spec: Spec | None = None, **kw) -> Generated:
    """Run a workload to completion; `.records` is the log."""
    spec = spec or Spec(**kw)
    config = {"policy": spec.policy or Policy(), "keep_records": True, "inputs": spec.extra_inputs}
    wl, cl = workload(spec), cluster(spec)
    policy = XirangPolicy(config, cl, spec.seed)
    sim = Simulator(wl, cl, policy)
    sim.run()
    sim.run_due()  # the simulator stops at the last job's end: its facts and later inputs still land
    result = SimResult(
        policy="xirang",
        workload=wl.name,
        seed=spec.seed,
        total_gpus=cl.total_gpus,
        jobs=[sim.jobs[job.id].out for job in wl.jobs],
        end_ms=sim.now,
        wall_s=0.0,
        steps=policy.steps,
        events=sim.events,
        extra=policy.summary(),
    )
    return Generated(records=policy.records, state=policy.state, result=result)
