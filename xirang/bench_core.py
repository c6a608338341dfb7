"""`xirang bench core`: how fast the pure core is.

- throughput: inputs and events per second through `step` on a generated workload (a
  512-GPU cluster, Poisson arrivals at all levels, the simulator's hosts answering every
  decision: start, checkpoint, notice, release, finish);
- decision cost: the time of one scheduling decision (a level-1 job submitted into a full
  10,000-GPU cluster, which plans a preemption) with 1,000 / 10,000 / 100,000 jobs pending,
  and the ratio of the largest to the smallest, measured side by side in one run; and the
  time of one tick's scheduling pass (every urgent job tried, the budgeted less urgent
  candidates, aging, placement) over the same backlogs.
"""

from __future__ import annotations

import random
import resource
import statistics
import sys
import time

from core import new_state, step
from core import types as T
from replay.peers.xirang import XirangPolicy
from replay.sim import Cluster, Simulator
from replay.workload import TraceJob, Workload

DECISION_GPUS = 10_000
GPUS_PER_NODE = 8


def run(args) -> dict:
    """`xirang bench core`: core throughput, and decision and tick cost as the backlog grows;
    the numbers as a dict."""
    quick = bool(getattr(args, "quick", False))
    sizes = [1_000, 10_000] if quick else [1_000, 10_000, 100_000]
    result = {
        "throughput": throughput(inputs_max=3_000 if quick else 40_000, seed=1),
        "decision": {},
    }
    for pending in sizes:
        _progress(f"decision cost with {pending} pending jobs on {DECISION_GPUS} GPUs")
        result["decision"][str(pending)] = decision_cost(pending, samples=5 if quick else 15)
    smallest, largest = result["decision"][str(sizes[0])], result["decision"][str(sizes[-1])]
    result["decision_ratio_largest_to_smallest"] = round(largest["median_ms"] / smallest["median_ms"], 3)
    result["tick_ratio_largest_to_smallest"] = round(
        largest["tick_median_ms"] / max(smallest["tick_median_ms"], 1e-6), 3
    )
    result["decision_ratio_goal_max"] = 3.0
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def _progress(message: str) -> None:
    print(f"bench core: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- throughput


def throughput(inputs_max: int, seed: int) -> dict:
    """A generated workload through the simulator (`replay.sim`: the simulated hosts answer
    every decision: start, checkpoint, notice, release, finish) with `core.step` deciding;
    counts what the core does and times only its steps."""
    _progress(f"throughput over about {inputs_max} inputs")
    rng = random.Random(seed)
    nodes = tuple((f"n{i:03d}", "A100" if i % 2 else "H100", GPUS_PER_NODE) for i in range(64))
    jobs, t_submit = [], 0
    for j in range(inputs_max // 12):  # with its ticks and checkpoints, about 12 inputs a job
        t_submit += int(rng.expovariate(1 / 20_000))
        duration = int(rng.expovariate(1 / 3_600_000)) + 60_000
        jobs.append(
            TraceJob(
                id=f"job-{j}",
                submit_ms=t_submit,
                duration_ms=duration,
                gpus=rng.choice([1, 1, 2, 4, 8, 16]),
                team=f"team-{rng.randint(1, 8)}",
                user=f"user-{rng.randint(1, 30)}",
                level=rng.choice([0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 7]),
                gpu_models=rng.choice([["A100"], ["H100"], ["A100", "H100"]]),
                est_runtime_ms=rng.choice([600, 3600, 4 * 3600]) * 1000,
                ckpt_interval_ms=900_000,
                ckpt_cost_ms=20_000,
                restore_cost_ms=15_000,
            )
        )
    cluster = Cluster(nodes)
    policy = _TimedCore({}, cluster, seed)
    sim = Simulator(Workload(name="bench", jobs=jobs, seed=seed), cluster, policy)
    sim.run()
    inputs, events, seconds = policy.steps, sum(policy.counts.values()), policy.core_s
    return {
        "inputs": inputs,
        "events": events,
        "seconds": round(seconds, 3),
        "inputs_per_s": round(inputs / seconds),
        "events_per_s": round(events / seconds),
        "simulated_hours": round(sim.now / 3_600_000, 2),
    }


class _TimedCore(XirangPolicy):
    """xirang's simulator adapter, timing each step of the core (and handing its decisions
    to the hosts), not the hosts' own bookkeeping."""

    core_s = 0.0

    def _step(self, inp: T.Input) -> None:
        began = time.perf_counter()
        super()._step(inp)
        self.core_s += time.perf_counter() - began


# ---------------------------------------------------------------- decision cost


def decision_cost(pending: int, samples: int) -> dict:
    """A full 10,000-GPU cluster of level-5 jobs, `pending` queued jobs, then level-1 jobs
    arriving one at a time; each plans a preemption and is cancelled (untimed) to restore
    the cluster for the next sample."""
    rng = random.Random(pending)
    state = new_state()
    nodes = DECISION_GPUS // GPUS_PER_NODE
    t = 0
    for i in range(nodes):
        step(state, T.NodeUp(t=t, node=f"n{i:05d}", gpu_model="A100", gpus=GPUS_PER_NODE))
    for i in range(nodes * 2):
        step(
            state,
            T.Submit(
                t=t,
                job=f"run-{i}",
                team=f"team-{i % 16}",
                user=f"user-{i % 64}",
                level=5,
                gpus=4,
                gpu_models=["A100"],
                est_runtime_s=rng.choice([3600, 36000]),
            ),
        )
        step(state, T.Started(t=t, job=f"run-{i}"))
    for i in range(pending):
        t = 1 + i // 50
        step(
            state,
            T.Submit(
                t=t,
                job=f"wait-{i}",
                team=f"team-{i % 16}",
                user=f"user-{i % 64}",
                level=rng.choice([3, 4, 5, 6, 7]),
                gpus=rng.choice([1, 2, 4, 8]),
                gpu_models=["A100"],
                est_runtime_s=3600,
            ),
        )
    t += 60_000
    timings: list[float] = []
    planned = 0
    for s in range(samples):
        t += 1_000
        urgent = T.Submit(
            t=t,
            job=f"urgent-{s}",
            team=f"oncall-{s}",
            user=f"sre-{s}",
            level=1,
            gpus=8,
            gpu_models=["A100"],
            est_runtime_s=1800,
        )
        begin = time.perf_counter()
        _, records = step(state, urgent)
        timings.append((time.perf_counter() - begin) * 1000)
        planned += sum(1 for r in records if isinstance(r.event, T.PreemptionPlanned))
        step(state, T.Cancel(t=t, job=f"urgent-{s}"))
    # A scheduling pass on a tick: every urgent job tried (none waits here), the budgeted
    # candidates of the less urgent levels, aging and placement over the whole backlog.
    ticks: list[float] = []
    for _ in range(samples):
        t += 60_000
        begin = time.perf_counter()
        step(state, T.Tick(t=t))
        ticks.append((time.perf_counter() - begin) * 1000)
    return {
        "pending": pending,
        "gpus": DECISION_GPUS,
        "running_jobs": nodes * 2,
        "samples": samples,
        "preemptions_planned": planned,
        "median_ms": round(statistics.median(timings), 3),
        "p90_ms": round(sorted(timings)[int(0.9 * (len(timings) - 1))], 3),
        "tick_median_ms": round(statistics.median(ticks), 3),
    }
