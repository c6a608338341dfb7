"""`xirang bench core`: how fast the pure core is.

- throughput: inputs and events per second through `step` on a generated workload (a
  512-GPU cluster, Poisson arrivals at all levels, the simulator's hosts answering every
  decision: start, checkpoint, notice, release, finish);
- decision cost: the time of one scheduling decision (a level-1 job submitted into a full
  10,000-GPU cluster, which plans a preemption) with 1,000 / 10,000 / 100,000 jobs pending,
  and the ratio of the largest to the smallest, measured side by side in one run; and the
  time of one tick's scheduling pass (every urgent job tried, the budgeted less urgent
  candidates, aging, placement) over the same backlogs;
- scale (`--gpus 10000,50000,100000`, with `--pending` for the backlogs): the same full
  pool at each size, and at each the cost of building it (inputs per second through
  `step`), of one preemption decision, of one tick, and of each kind of input a live pool
  sees all the time (a submit that queues, a job's exit, its checkpoint facts), with the
  ratio of the largest cluster to the smallest for each.
"""

from __future__ import annotations

import random
import resource
import statistics
import sys
import time
from typing import Iterator

from core import new_state, step
from core import types as T
from xirang.errors import UserError
from replay.peers.xirang import XirangPolicy
from replay.sim import Cluster, Simulator
from replay.workload import TraceJob, Workload

DECISION_GPUS = 10_000
GPUS_PER_NODE = 8


def run(args) -> dict:
    """`xirang bench core`: core throughput, and decision and tick cost as the backlog grows
    (or, with `--gpus`, as the cluster grows); the numbers as a dict."""
    quick = bool(getattr(args, "quick", False))
    pendings = parse_sizes(getattr(args, "pending", None), "--pending")
    gpus = parse_sizes(getattr(args, "gpus", None), "--gpus")
    if gpus:
        return scale(gpus, pendings or [10_000], samples=5 if quick else 15)
    sizes = pendings or ([1_000, 10_000] if quick else [1_000, 10_000, 100_000])
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
    result["peak_rss_mib"] = _peak_rss_mib()
    return result


def parse_sizes(text: str | None, option: str) -> list[int]:
    """`10000,50000` as [10000, 50000], in the order given; a clear error for anything else."""
    if not text:
        return []
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(
            f"{option} takes whole numbers separated by commas, like 10000,50000; got {text!r}"
        ) from None
    if not sizes or any(n < 0 for n in sizes):
        raise UserError(f"{option} takes numbers of 0 or more, like 10000,50000; got {text!r}")
    if option == "--gpus" and any(n < GPUS_PER_NODE for n in sizes):
        raise UserError(f"--gpus: each pool needs at least one {GPUS_PER_NODE}-GPU node; got {text!r}")
    return sizes


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


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


def full_pool_inputs(gpus: int, pending: int) -> Iterator[T.Input]:
    """The inputs that fill a pool of `gpus` A100s (8-GPU nodes) with level-5 4-GPU jobs, two
    a node, each started as soon as it is placed (their `started` facts follow their
    submits), then queue `pending` jobs at levels 3-7 of 1-8 GPUs behind them; times from
    0 up to `pool_end_t(pending)`. The same stream for the same sizes."""
    rng = random.Random(pending)
    nodes = gpus // GPUS_PER_NODE
    for i in range(nodes):
        yield T.NodeUp(t=0, node=f"n{i:05d}", gpu_model="A100", gpus=GPUS_PER_NODE)
    for i in range(nodes * 2):
        yield T.Submit(
            t=0,
            job=f"run-{i}",
            team=f"team-{i % 16}",
            user=f"user-{i % 64}",
            level=5,
            gpus=4,
            gpu_models=["A100"],
            est_runtime_s=rng.choice([3600, 36000]),
        )
        yield T.Started(t=0, job=f"run-{i}")
    for i in range(pending):
        yield T.Submit(
            t=1 + i // 50,
            job=f"wait-{i}",
            team=f"team-{i % 16}",
            user=f"user-{i % 64}",
            level=rng.choice([3, 4, 5, 6, 7]),
            gpus=rng.choice([1, 2, 4, 8]),
            gpu_models=["A100"],
            est_runtime_s=3600,
        )


def pool_end_t(pending: int) -> int:
    """The time of the last input of `full_pool_inputs`."""
    return 1 + (pending - 1) // 50 if pending else 0


def urgent_submit(t: int, sample: int) -> T.Submit:
    """The level-1 8-GPU job whose arrival in the full pool plans a preemption."""
    return T.Submit(
        t=t,
        job=f"urgent-{sample}",
        team=f"oncall-{sample}",
        user=f"sre-{sample}",
        level=1,
        gpus=8,
        gpu_models=["A100"],
        est_runtime_s=1800,
    )


def decision_cost(pending: int, samples: int, gpus: int = DECISION_GPUS) -> dict:
    """A full cluster of `gpus` GPUs of level-5 jobs, `pending` queued jobs, then level-1 jobs
    arriving one at a time; each plans a preemption and is cancelled (untimed) to restore
    the cluster for the next sample."""
    state = new_state()
    for inp in full_pool_inputs(gpus, pending):
        step(state, inp)
    result, _ = _decisions_and_ticks(state, pool_end_t(pending) + 60_000, samples)
    return {"pending": pending, "gpus": gpus, "running_jobs": gpus // GPUS_PER_NODE * 2, **result}


def _decisions_and_ticks(state, t: int, samples: int, clock=time.perf_counter) -> tuple[dict, int]:
    timings: list[float] = []
    planned = 0
    for s in range(samples):
        t += 1_000
        begin = clock()
        _, records = step(state, urgent_submit(t, s))
        timings.append((clock() - begin) * 1000)
        planned += sum(1 for r in records if isinstance(r.event, T.PreemptionPlanned))
        step(state, T.Cancel(t=t, job=f"urgent-{s}"))
    # A scheduling pass on a tick: every urgent job tried (none waits here), the budgeted
    # candidates of the less urgent levels, aging and placement over the whole backlog.
    ticks: list[float] = []
    for _ in range(samples):
        t += 60_000
        begin = clock()
        step(state, T.Tick(t=t))
        ticks.append((clock() - begin) * 1000)
    result = {
        "samples": samples,
        "preemptions_planned": planned,
        "median_ms": round(statistics.median(timings), 3),
        "p90_ms": _p90(timings),
        "tick_median_ms": round(statistics.median(ticks), 3),
    }
    return result, t


def _p90(timings: list[float]) -> float:
    return round(sorted(timings)[int(0.9 * (len(timings) - 1))], 3)


# ---------------------------------------------------------------- scale


def scale(gpus_sizes: list[int], pendings: list[int], samples: int) -> dict:
    """Each pool size in `gpus_sizes` with each backlog in `pendings`, built and measured one
    after another in this process; the ratios of the largest cluster to the smallest. Every
    time is this process's CPU time: on a shared machine the wall clock counts others' work."""
    result: dict = {"clock": "process CPU time", "sizes": [], "ratios_largest_to_smallest_cluster": {}}
    smallest, largest = min(gpus_sizes), max(gpus_sizes)
    for pending in pendings:
        by_gpus = {}
        for gpus in gpus_sizes:
            by_gpus[gpus] = size_cost(gpus, pending, samples)
            result["sizes"].append(by_gpus[gpus])
        low, high = by_gpus[smallest], by_gpus[largest]
        ratios = {
            "gpus": f"{largest}/{smallest}",
            "decision": _ratio(high["decision_median_ms"], low["decision_median_ms"]),
            "tick": _ratio(high["tick_median_ms"], low["tick_median_ms"]),
            "build_per_input": _ratio(high["build"]["us_per_input"], low["build"]["us_per_input"]),
        }
        for kind in high["per_input_median_us"]:
            ratios[kind] = _ratio(high["per_input_median_us"][kind], low["per_input_median_us"][kind])
        result["ratios_largest_to_smallest_cluster"][str(pending)] = ratios
    result["goals"] = {"decision_ratio_max": 2.0, "per_input_ratio_max": 1.5, "decision_ms_max": 50}
    result["peak_rss_mib"] = _peak_rss_mib()
    return result


def _ratio(high: float, low: float) -> float:
    return round(high / max(low, 1e-6), 3)


def size_cost(gpus: int, pending: int, samples: int) -> dict:
    """One pool (`full_pool_inputs`): the time to build it through `step`, by input kind; then
    `samples` preemption decisions and ticks (`decision_cost`'s), and `samples` of each
    input a live pool sees all the time: a level-6 submit that queues (then cancelled,
    untimed), a running job's checkpoint_started and checkpoint_saved, and its exit
    (`finished`, whose freed GPUs the placement pass hands to queued jobs; their starts
    follow, untimed)."""
    state = new_state()
    nodes = gpus // GPUS_PER_NODE
    total = nodes + nodes * 4 + pending
    build_s: dict[str, float] = {}
    build_n: dict[str, int] = {}
    done, running, shown = 0, 0, time.monotonic()
    _progress(f"{gpus} GPUs, {pending} pending: building the pool ({total} inputs)")
    wall_began = time.perf_counter()
    for inp in full_pool_inputs(gpus, pending):
        begin = time.process_time()
        _, records = step(state, inp)
        took = time.process_time() - begin
        running += sum(1 for record in records if isinstance(record.event, T.JobRunning))
        kind = _build_kind(inp)
        build_s[kind] = build_s.get(kind, 0.0) + took
        build_n[kind] = build_n.get(kind, 0) + 1
        done += 1
        if time.monotonic() - shown >= 5:
            shown = time.monotonic()
            rate = done / sum(build_s.values())
            _progress(f"{gpus} GPUs, {pending} pending: {done} of {total} inputs ({rate:.0f}/s in step)")
    seconds = sum(build_s.values())
    build = {
        "inputs": done,
        "seconds": round(seconds, 3),
        "wall_seconds": round(time.perf_counter() - wall_began, 3),
        "inputs_per_s": round(done / seconds),
        "us_per_input": round(seconds / done * 1e6, 1),
        "us_per_input_by_kind": {k: round(build_s[k] / build_n[k] * 1e6, 1) for k in sorted(build_s)},
    }
    _progress(f"{gpus} GPUs, {pending} pending: built in {seconds:.1f} s; {samples} decisions and ticks")
    decided, t = _decisions_and_ticks(state, pool_end_t(pending) + 60_000, samples, time.process_time)
    _progress(f"{gpus} GPUs, {pending} pending: decision median {decided['median_ms']} ms; per-input costs")
    per_input = _per_input_costs(state, t, samples, [f"run-{i}" for i in range(nodes * 2)])
    return {
        "gpus": gpus,
        "nodes": nodes,
        "running_jobs": running,
        "pending": pending,
        "build": build,
        "decision_median_ms": decided["median_ms"],
        "decision_p90_ms": decided["p90_ms"],
        "preemptions_planned": decided["preemptions_planned"],
        "tick_median_ms": decided["tick_median_ms"],
        "per_input_median_us": per_input,
        "samples": samples,
    }


def _build_kind(inp: T.Input) -> str:
    if isinstance(inp, T.Submit):
        return "submit_running" if inp.job.startswith("run-") else "submit_pending"
    return T.type_name(inp)


def _per_input_costs(state, t: int, samples: int, running: list[str]) -> dict:
    timed: dict[str, list[float]] = {
        "submit": [],
        "checkpoint_started": [],
        "checkpoint_saved": [],
        "finished": [],
    }

    def timed_step(kind: str, inp: T.Input) -> list:
        begin = time.process_time()
        _, records = step(state, inp)
        timed[kind].append((time.process_time() - begin) * 1e6)
        return records

    for s in range(samples):
        t += 1_000
        timed_step(
            "submit",
            T.Submit(
                t=t,
                job=f"probe-{s}",
                team=f"team-{s % 16}",
                user=f"user-{s % 64}",
                level=6,
                gpus=4,
                gpu_models=["A100"],
                est_runtime_s=3600,
            ),
        )
        step(state, T.Cancel(t=t, job=f"probe-{s}"))
    for s in range(samples):
        t += 1_000
        job = running[s * 7 % len(running)]
        timed_step("checkpoint_started", T.CheckpointStarted(t=t, job=job))
        t += 1_000
        saved = T.CheckpointSaved(t=t, job=job, step=s + 1, digest=f"sha256:{s:064x}", bytes=1 << 30)
        timed_step("checkpoint_saved", saved)
    for s in range(samples):
        t += 1_000
        records = timed_step("finished", T.Finished(t=t, job=running[-1 - s], ok=True))
        for record in records:  # the hosts start what the freed GPUs were given to
            if isinstance(record.event, (T.JobStartRequested, T.JobResumeRequested)):
                step(state, T.Started(t=t, job=record.event.job))
    return {kind: round(statistics.median(us), 1) for kind, us in timed.items()}
