"""`xirang bench philly --json`: the four policies on the whole Philly trace, side by side as
`xirang sim` runs them, against the goal of five minutes.

The trace (82,247 jobs; `--quick`: its first 60) on 512 GPUs with seed 0, every policy
(none, k8s, slurm, xirang) in `xirang sim`'s worker processes (2, xirang first), then the
scorecard. `wall_s` is the whole (trace loading, simulations, scorecard; not the files
`xirang sim` writes); each policy's `cpu_s` beside its `sim_wall_s`, and the load average
before and after: on a shared machine the wall clock depends on what else runs.
"""

from __future__ import annotations

import os
import platform
import time
from argparse import Namespace

FOUR_POLICIES_GOAL_S = 300  # the four policies on full Philly within 5 minutes
JOBS_QUICK = 60
GPUS = 512
PROCS = 2


def run(args) -> dict:
    """`xirang bench philly`: the four policies' run on full Philly, timed."""
    from replay.peers import POLICIES
    from replay.scorecard import scorecard
    from xirang.cmd_sim import _plan, run_policies

    quick = getattr(args, "quick", False)
    load_before = os.getloadavg()
    began = time.perf_counter()
    sim_args = Namespace(
        trace="philly",
        philly_path=None,
        gpus=GPUS,
        node_gpus=8,
        gpu_models="V100",
        policies=",".join(POLICIES),
        limit=JOBS_QUICK if quick else None,
        seed=0,
        policy=None,
        xirang_periodic_ckpt_reports="on",
        xirang_tick_s=60.0,
        procs=PROCS,
    )
    results, cards = run_policies(_plan(sim_args), PROCS, quiet=True)
    card = scorecard(results, cards)
    wall_s = time.perf_counter() - began
    return {
        "bench": "philly",
        "trace": "philly",
        "jobs": card["jobs"],
        "gpus": GPUS,
        "seed": 0,
        "procs": PROCS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "wall_s": round(wall_s, 1),
        "goal_wall_s": FOUR_POLICIES_GOAL_S,
        "within_goal": wall_s <= FOUR_POLICIES_GOAL_S,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "policies": {
            result.policy: {
                "sim_wall_s": round(result.wall_s, 1),
                "cpu_s": result.extra.get("cpu_s"),
                "steps": result.steps,
                "events": result.events,
            }
            for result in results
        },
    }
