"""`xirang bench sim --json`: simulated events per second for each policy, in one run.

Every policy runs the same Philly prefix (5,000 jobs; `--quick`: 60) on 512 GPUs with
seed 0, one after another in this process, so the numbers compare side by side.
`events_per_s` counts simulator events (arrivals, host timers, facts, wake-ups);
`steps_per_s` counts scheduling decisions (for xirang, `core.step` calls).
"""

from __future__ import annotations

import platform

from .peers import POLICIES
from .sim import Cluster, simulate
from .workload import load_trace

JOBS_FULL = 5_000
JOBS_QUICK = 60
GPUS = 512


def run(args) -> dict:
    """`xirang bench sim`: each policy on the first Philly jobs on 512 GPUs; simulated events
    and decisions per wall second."""
    jobs = JOBS_QUICK if getattr(args, "quick", False) else JOBS_FULL
    workload = load_trace("philly", seed=0, limit=jobs)
    cluster = Cluster.uniform(GPUS)
    out = {
        "bench": "sim",
        "trace": "philly",
        "jobs": jobs,
        "gpus": GPUS,
        "seed": 0,
        "python": platform.python_version(),
        "policies": {},
    }
    for name in POLICIES:
        result = simulate(workload, cluster, name, {}, 0)
        wall = max(result.wall_s, 1e-9)
        out["policies"][name] = {
            "wall_s": round(result.wall_s, 3),
            "events": result.events,
            "events_per_s": round(result.events / wall, 1),
            "steps": result.steps,
            "steps_per_s": round(result.steps / wall, 1),
            "jobs_per_s": round(len(result.jobs) / wall, 1),
        }
    fastest = max(p["events_per_s"] for p in out["policies"].values())
    for entry in out["policies"].values():
        entry["events_per_s_vs_fastest"] = round(entry["events_per_s"] / fastest, 4)
    return out
