"""`xirang bench core`: how fast the pure core is.

- throughput: inputs and events per second through `step` on a generated workload (a
  512-GPU cluster, Poisson arrivals at all levels, agents that answer every decision
  promptly: start, checkpoint, release, finish);
- decision cost: the time of one scheduling decision (a level-1 job submitted into a full
  10,000-GPU cluster, which plans a preemption) with 1,000 / 10,000 / 100,000 jobs pending,
  and the ratio of the largest to the smallest, measured side by side in one run; and the
  time of one tick's scheduling pass (every urgent job tried, the budgeted less urgent
  candidates, aging, placement) over the same backlogs.
"""

from __future__ import annotations

import heapq
import random
import resource
import statistics
import sys
import time

from core import new_state, step
from core import types as T

DECISION_GPUS = 10_000
GPUS_PER_NODE = 8


def run(args) -> dict:
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
    result["tick_ratio_largest_to_smallest"] = round(largest["tick_median_ms"] / max(smallest["tick_median_ms"], 1e-6), 3)
    result["decision_ratio_goal_max"] = 3.0
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def _progress(message: str) -> None:
    print(f"bench core: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- throughput


def throughput(inputs_max: int, seed: int) -> dict:
    """Drive a generated workload through step() with prompt agents; count what it does."""
    _progress(f"throughput over {inputs_max} inputs")
    rng = random.Random(seed)
    state = new_state()
    due: list[tuple[int, int, T.Input]] = []  # (t, tie, input)
    tie = 0

    def later(t: int, inp: T.Input) -> None:
        nonlocal tie
        tie += 1
        heapq.heappush(due, (t, tie, inp))

    for i in range(64):
        later(0, T.NodeUp(node=f"n{i:03d}", gpu_model="A100" if i % 2 else "H100", gpus=GPUS_PER_NODE))
    t_submit = 0
    for j in range(inputs_max // 6):
        t_submit += int(rng.expovariate(1 / 20_000))
        later(t_submit, T.Submit(
            job=f"job-{j}", team=f"team-{rng.randint(1, 8)}", user=f"user-{rng.randint(1, 30)}",
            level=rng.choice([0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 7]), gpus=rng.choice([1, 1, 2, 4, 8, 16]),
            gpu_models=rng.choice([["A100"], ["H100"], ["A100", "H100"]]),
            est_runtime_s=rng.choice([600, 3600, 4 * 3600]), ckpt_interval_s=900, ckpt_cost_s=20,
            restore_cost_s=15))
    durations: dict[str, int] = {}
    inputs = events = 0
    t = 0
    started_at = time.perf_counter()
    while due and inputs < inputs_max:
        t, _, inp = heapq.heappop(due)
        _, records = step(state, _stamped(inp, t))
        inputs += 1
        events += len(records)
        for record in records:
            _answer(record.event, t, rng, durations, later, state)
        if not due or due[0][0] > t + 60_000:
            later(t + 60_000, T.Tick())
    seconds = time.perf_counter() - started_at
    return {"inputs": inputs, "events": events, "seconds": round(seconds, 3),
            "inputs_per_s": round(inputs / seconds), "events_per_s": round(events / seconds),
            "simulated_hours": round(t / 3_600_000, 2)}


def _stamped(inp: T.Input, t: int) -> T.Input:
    import msgspec

    return msgspec.structs.replace(inp, t=t)


def _answer(ev, t, rng, durations, later, state) -> None:
    if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
        later(t + 2_000, T.Started(job=ev.job))
        if ev.job not in durations:
            durations[ev.job] = int(rng.expovariate(1 / 3_600_000)) + 60_000
        job = state.canonical.jobs[ev.job]
        remaining = max(1_000, durations[ev.job] - job.progress_ms)
        later(t + 2_000 + remaining, T.Finished(job=ev.job, ok=True))
    elif isinstance(ev, T.VictimNotified):
        later(t + 15_000, T.SafePoint(job=ev.job))
        if ev.checkpoint_needed:
            later(t + 30_000, T.CheckpointSaved(job=ev.job, step=t // 1000, digest=f"sha256:{ev.job}{t}",
                                                bytes=1 << 30))
        later(t + 31_000, T.Released(job=ev.job))


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
        step(state, T.Submit(t=t, job=f"run-{i}", team=f"team-{i % 16}", user=f"user-{i % 64}",
                             level=5, gpus=4, gpu_models=["A100"], est_runtime_s=rng.choice([3600, 36000])))
        step(state, T.Started(t=t, job=f"run-{i}"))
    for i in range(pending):
        t = 1 + i // 50
        step(state, T.Submit(t=t, job=f"wait-{i}", team=f"team-{i % 16}", user=f"user-{i % 64}",
                             level=rng.choice([3, 4, 5, 6, 7]), gpus=rng.choice([1, 2, 4, 8]),
                             gpu_models=["A100"], est_runtime_s=3600))
    t += 60_000
    timings: list[float] = []
    planned = 0
    for s in range(samples):
        t += 1_000
        urgent = T.Submit(t=t, job=f"urgent-{s}", team=f"oncall-{s}", user=f"sre-{s}", level=1, gpus=8,
                          gpu_models=["A100"], est_runtime_s=1800)
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
    return {"pending": pending, "gpus": DECISION_GPUS, "running_jobs": nodes * 2,
            "samples": samples, "preemptions_planned": planned,
            "median_ms": round(statistics.median(timings), 3),
            "p90_ms": round(sorted(timings)[int(0.9 * (len(timings) - 1))], 3),
            "tick_median_ms": round(statistics.median(ticks), 3)}
