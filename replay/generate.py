"""A generated workload that stresses the urgent levels: a steady, overloaded background of
mid and low priority work, and bursts of urgent jobs (levels 0-1) with whole-node and
multi-node gangs among them.

    from replay.workload import load_trace
    workload = load_trace("bursts:256", seed=0)   # scaled to the pool (rows: bursts_rows)

The background's offered load is `load` times the pool (1.3: overloaded, the queue grows
while the bursts come), so every policy must preempt to keep urgent jobs fast, and the
price of doing so is visible. Every draw comes from a `random.Random` seeded by the seed
and the column, so the same seed and pool give the same jobs. The trace spec
`bursts:<gpus>[:<load>]` names it wherever a trace is taken (`replay.workload.load_trace`).
Checkpoint intervals, costs and time limits get the same seeded defaults as any trace
(`replay.workload`).
"""

from __future__ import annotations

import math
import random

BURSTS_HOURS = 48.0  # length of the arrival window
BURSTS_TEAMS = ("atlas", "borealis", "cirrus", "delta", "ember", "fjord")
BURSTS_TEAM_WEIGHTS = (0.30, 0.22, 0.18, 0.12, 0.10, 0.08)  # a few big teams, a tail of small
BACKGROUND_LEVELS = (2, 3, 4, 5, 6, 7)
BACKGROUND_LEVEL_WEIGHTS = (0.10, 0.20, 0.25, 0.20, 0.15, 0.10)
BACKGROUND_GPUS = (1, 2, 4, 8, 16, 32)
BACKGROUND_GPUS_WEIGHTS = (0.50, 0.15, 0.15, 0.14, 0.05, 0.01)
BACKGROUND_MEDIAN_S = 3600.0
BACKGROUND_SIGMA = 1.4  # lognormal spread: most jobs short, a heavy tail
DURATION_MAX_S = 72 * 3600.0
BURST_EVERY_S = 3 * 3600.0  # mean time between bursts
BURST_JOBS = (3, 12)  # urgent jobs per burst, uniform
BURST_SPREAD_S = 120.0  # a burst's jobs arrive within two minutes
URGENT_GPUS = (1, 2, 4, 8, 16)  # 8: a whole node; 16: a two-node gang
URGENT_GPUS_WEIGHTS = (0.30, 0.20, 0.20, 0.20, 0.10)
URGENT_MEDIAN_S = 1800.0
USERS_PER_TEAM = 6


def bursts_rows(
    seed: int = 0, gpus_total: int = 256, load: float = 1.3, node_gpus: int = 8, hours: float = BURSTS_HOURS
) -> tuple[str, list[dict]]:
    """The generated workload's name and trace rows for a pool of `gpus_total` GPUs (see
    the module doc); `replay.workload` completes them into a `Workload`."""
    rng = {
        name: random.Random(f"bursts/{seed}/{name}")
        for name in ("arrival", "size", "duration", "level", "team", "user", "burst")
    }
    size_cap = max(1, gpus_total // 4)
    raw: list[dict] = []
    mean_gpu_s = _mean_gpu_seconds(size_cap)
    rate_per_s = load * gpus_total / mean_gpu_s
    t = 0.0
    end_s = hours * 3600.0
    while True:
        t += rng["arrival"].expovariate(rate_per_s)
        if t >= end_s:
            break
        gpus = min(size_cap, rng["size"].choices(BACKGROUND_GPUS, BACKGROUND_GPUS_WEIGHTS)[0])
        level = rng["level"].choices(BACKGROUND_LEVELS, BACKGROUND_LEVEL_WEIGHTS)[0]
        raw.append(_row(rng, t, gpus, level, BACKGROUND_MEDIAN_S))
    t = 0.0
    burst = rng["burst"]
    while True:
        t += burst.expovariate(1.0 / BURST_EVERY_S)
        if t >= end_s:
            break
        for _ in range(burst.randint(*BURST_JOBS)):
            at = t + burst.uniform(0.0, BURST_SPREAD_S)
            gpus = min(size_cap, max(1, node_gpus * burst.choices(URGENT_GPUS, URGENT_GPUS_WEIGHTS)[0] // 8))
            raw.append(_row(rng, at, gpus, burst.choice((0, 1)), URGENT_MEDIAN_S))
    raw.sort(key=lambda item: (item["submit_s"], item["job"]))
    for i, item in enumerate(raw):
        item["job"] = f"gen-{i:06d}"
    return f"bursts:{gpus_total}:{load:g}", raw


def _row(rng, t: float, gpus: int, level: int, median_s: float) -> dict:
    duration = min(
        DURATION_MAX_S, max(30.0, rng["duration"].lognormvariate(math.log(median_s), BACKGROUND_SIGMA))
    )
    team = rng["team"].choices(BURSTS_TEAMS, BURSTS_TEAM_WEIGHTS)[0]
    user = f"{team}-u{rng['user'].randrange(1, USERS_PER_TEAM + 1)}"
    return dict(
        job=f"{t:.3f}/{level}/{gpus}",
        submit_s=t,
        duration_s=duration,
        gpus=gpus,
        team=team,
        user=user,
        level=level,
    )


def _mean_gpu_seconds(size_cap: int) -> float:
    """Expected GPUs x duration of one background job (lognormal mean, sizes capped)."""
    mean_gpus = sum(min(size_cap, g) * w for g, w in zip(BACKGROUND_GPUS, BACKGROUND_GPUS_WEIGHTS))
    mean_duration = BACKGROUND_MEDIAN_S * math.exp(BACKGROUND_SIGMA**2 / 2)
    return mean_gpus * mean_duration


def parse_bursts_spec(spec: str) -> tuple[int, float]:
    """`bursts:<gpus>[:<load>]` -> (gpus, load). Raises ValueError saying what to fix."""
    parts = spec.split(":")
    if parts[0] != "bursts" or len(parts) not in (2, 3):
        raise ValueError(f"{spec!r}: write bursts:<gpus>[:<load>], e.g. bursts:256:1.3")
    try:
        gpus = int(parts[1])
        load = float(parts[2]) if len(parts) == 3 else 1.3
    except ValueError:
        raise ValueError(f"{spec!r}: gpus must be a whole number and load a number") from None
    if gpus <= 0 or not load > 0:
        raise ValueError(f"{spec!r}: gpus and load must be positive")
    return gpus, load
