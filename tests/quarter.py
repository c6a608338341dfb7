"""A simulated quarter: a synthetic workload of 2026Q3 run by the simulator, which keeps
the core's log (with survey answers appended after the run), for the review's tests."""

from __future__ import annotations

import random

from core import rebuild, step
from core import types as T
from core.model.policy import Policy
from replay.sim import Cluster, simulate
from replay.workload import TraceJob, Workload

MIN = 60_000
HOUR = 3_600_000
DAY = 24 * HOUR
Q3_START_MS = 1_782_864_000_000  # 2026-07-01 00:00 UTC
QUARTER_DAYS = 92
TEAMS = ("vision", "lm", "search", "ops")


def quarter_workload(seed: int = 3, jobs_per_day: int = 6) -> Workload:
    """Batch and mid-level jobs from three teams keep 16 GPUs busy; urgent fixes from ops
    arrive now and then. The last jobs run past the quarter's end, so the log covers it."""
    rng = random.Random(seed)
    jobs = []
    for day in range(QUARTER_DAYS):
        for k in range(jobs_per_day):
            team = rng.choice(TEAMS[:3])
            level = rng.choice((3, 4, 5, 6, 6, 7))
            gpus = rng.choice((2, 4, 4, 8))
            duration = rng.randint(2 * HOUR, 10 * HOUR)
            jobs.append(
                TraceJob(
                    id=f"{team}-{day:02d}-{k}",
                    submit_ms=day * DAY + rng.randint(0, DAY - 1),
                    duration_ms=duration,
                    gpus=gpus,
                    team=team,
                    user=f"{team}-u{rng.randint(1, 3)}",
                    level=level,
                    gpu_models=[],
                    ckpt_interval_ms=rng.choice((60, 90, 120)) * MIN,
                    ckpt_cost_ms=60_000,
                    restore_cost_ms=60_000,
                    est_runtime_ms=int(duration * rng.uniform(0.8, 1.5)),
                )
            )
        if rng.random() < 0.5:
            jobs.append(
                TraceJob(
                    id=f"fix-{day:02d}",
                    submit_ms=day * DAY + rng.randint(0, DAY - 1),
                    duration_ms=rng.randint(20, 90) * MIN,
                    gpus=rng.choice((4, 8)),
                    team="ops",
                    user="oncall",
                    level=rng.choice((0, 1)),
                    gpu_models=[],
                    ckpt_interval_ms=0,
                    ckpt_cost_ms=0,
                    restore_cost_ms=0,
                    est_runtime_ms=60 * MIN,
                )
            )
    # one long job from the last evening runs into the next quarter, so the log covers Q3 whole
    jobs.append(
        TraceJob(
            id="vision-closing",
            submit_ms=QUARTER_DAYS * DAY - 2 * HOUR,
            duration_ms=8 * HOUR,
            gpus=4,
            team="vision",
            user="vision-u1",
            level=6,
            gpu_models=[],
            ckpt_interval_ms=60 * MIN,
            ckpt_cost_ms=60_000,
            restore_cost_ms=60_000,
            est_runtime_ms=8 * HOUR,
        )
    )
    jobs.sort(key=lambda j: (j.submit_ms, j.id))
    return Workload("quarter-2026Q3", jobs, seed)


def simulated_quarter_log(path: str, policy: Policy | None = None, seed: int = 3) -> list[T.Record]:
    """Run the quarter, keep its log at `path`, then append survey answers (one per tenth
    job, scored by how long it waited) through the core; returns the records."""
    simulate(
        quarter_workload(seed),
        Cluster.uniform(16, 8),
        "xirang",
        {"policy": policy or Policy(), "log_path": path, "epoch_ms": Q3_START_MS, "urgent_tick_s": 60},
    )
    with open(path, "rb") as fh:
        records = [T.decode_record(line) for line in fh.read().splitlines()]
    state = rebuild(records)
    t = records[-1].event.t
    waited = {}
    started = {}
    for r in records:
        ev = r.event
        if isinstance(ev, T.JobSubmitted):
            waited[ev.job] = (ev.t, ev.user)
        elif isinstance(ev, T.JobRunning) and ev.job not in started:
            started[ev.job] = ev.t
    appended = []
    for i, job in enumerate(sorted(waited)):
        if i % 10 or job not in started:
            continue
        submit_t, user = waited[job]
        wait_h = (started[job] - submit_t) / HOUR
        score = 5 if wait_h < 0.5 else 4 if wait_h < 2 else 3 if wait_h < 6 else 2 if wait_h < 24 else 1
        t += 1000
        _, new = step(state, T.Feedback(t=t, job=job, user=user, score=score))
        appended.extend(new)
    with open(path, "ab") as fh:
        fh.write(b"".join(T.encode(r) + b"\n" for r in appended))
    return records + appended
