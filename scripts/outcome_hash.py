"""Per-job outcome hash of one simulated run: proves a speed change kept every decision.

Runs xirang (default policy, periodic checkpoint reports, 60 s ticks, seed 0) on the first
N Philly jobs on 512 GPUs, and hashes each job's outcome (first start, finish, preemptions,
lost progress, overhead, periodic checkpoints, held spans), sorted by job id, with the
run's end time and the core's step count. Prints one JSON line: hash, jobs, steps, wall_s.

    .venv/bin/python scripts/outcome_hash.py [--limit 15000] [--policy xirang] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import json
import time

from replay.sim import Cluster, simulate
from replay.workload import load_trace


def outcome_hash(
    limit: int, policy: str = "xirang", gpus: int = 512, seed: int = 0, profile: str | None = None
) -> dict:
    """Simulate the run and hash its per-job outcomes (with `profile`, cProfile stats there)."""
    workload = load_trace("philly", seed=seed, limit=limit or None)
    config = {"report_periodic_checkpoints": True, "tick_s": 60.0} if policy == "xirang" else {}
    began = time.perf_counter()
    cpu_began = time.process_time()
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    result = simulate(workload, Cluster.uniform(gpus), policy, config, seed=seed)
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    wall_s = time.perf_counter() - began
    cpu_s = time.process_time() - cpu_began
    rows = sorted((dataclasses.asdict(job) for job in result.jobs), key=lambda row: row["id"])
    blob = json.dumps({"jobs": rows, "end_ms": result.end_ms, "steps": result.steps}, sort_keys=True)
    return {
        "hash": hashlib.sha256(blob.encode()).hexdigest()[:16],
        "jobs": len(rows),
        "steps": result.steps,
        "end_ms": result.end_ms,
        "policy": policy,
        "limit": limit,
        "wall_s": round(wall_s, 1),
        "cpu_s": round(cpu_s, 1),
    }


def main() -> None:
    """Print one run's outcome hash as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=15_000, help="0: the whole trace")
    parser.add_argument("--policy", default="xirang")
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", help="write cProfile stats here")
    args = parser.parse_args()
    print(json.dumps(outcome_hash(args.limit, args.policy, args.gpus, args.seed, args.profile)))


if __name__ == "__main__":
    main()
