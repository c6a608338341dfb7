"""A running or queued job's release forecast: its expected runtime (learned per team and
kind), its remaining time (Lindy beyond the estimate) and that forecast as a function of
the time (`release_spec`, `remaining_at`). The base of core/forecast/waits.py and core/forecast/node_fit.py,
kept apart so that neither imports the other's module in a circle.
"""

from __future__ import annotations

from ..model.placement import gpus_on
from ..model.state import State
from ..model.entities import RUNNING, Job, job_progress_ms

# A job at (or just before, or just past) its estimate is expected to run 1/10 of it more.
LINDY_FLOOR_FRACTION = 10


def expected_runtime_ms(state: State, job: Job) -> int:
    """History of the same team and kind once it has enough samples, else the submitter's."""
    est = state.canonical.estimates.get(f"{job.team}/{job.kind}")
    if est is not None and est.samples >= state.canonical.policy.estimate_samples_min:
        return int(est.mean_ms)
    return job.est_runtime_ms


def remaining_ms(state: State, job: Job) -> int:
    """Expected runtime minus progress. A job already past its estimate has shown it runs
    long: runtimes are heavy-tailed, so it is expected to run about as long again as it has
    overrun (the Lindy effect), and at least a tenth of the estimate, never zero. The same
    floor holds just before the estimate: the forecast does not drop towards zero as a job
    nears its estimate only to jump back up once past it. (Without it, among hundreds of
    running jobs some are always seconds from their estimates, and a blocked urgent job
    expected releases within seconds that came minutes later, declining every preemption
    meanwhile.)"""
    total = expected_runtime_ms(state, job)
    done = job_progress_ms(job, state.canonical.t)
    return max(total - done, done - total, total // LINDY_FLOOR_FRACTION, 1)


def release_spec(state: State, job: Job) -> tuple:
    """`remaining_or_runtime` as a function of the time, (fixed, total, done, since, key,
    estimate): `fixed` when the value does not move (>= 0), else a running job's expected
    total and its progress `done` at `since`, from which it progresses at the clock's pace;
    and the learned estimate it used (valid while `estimates[key]` is that same one)."""
    key = f"{job.team}/{job.kind}"
    estimate = state.canonical.estimates.get(key)
    total = expected_runtime_ms(state, job)
    if job.state != RUNNING:
        return (total, 0, 0, 0, key, estimate)
    if job.run_started_t == 0 or job.frozen_t:
        return (remaining_ms(state, job), 0, 0, 0, key, estimate)
    return (-1, total, job.progress_ms, job.run_started_t, key, estimate)


def remaining_at(spec: tuple, t: int) -> int:
    """The value of a `release_spec` at time `t` (as `remaining_ms` computes it).
    `core.forecast.node_fit._release_piece` mirrors it piece by piece: change both (the test
    tests/test_core_forecast_over_time.py compares them)."""
    fixed, total, done, since = spec[:4]
    if fixed >= 0:
        return fixed
    done += max(0, t - since)
    return max(total - done, done - total, total // LINDY_FLOOR_FRACTION, 1)


def holder_specs(state: State, node) -> list[tuple[tuple, int]]:
    """(release spec, GPUs on the node) of each job holding GPUs on it, the specs memoised
    in the scratch (as `core.forecast.waits.remaining_or_runtime` keeps them): what both
    `core.forecast.waits.node_releases` and `core.forecast.node_fit` read a node's releases from."""
    ix = state.index
    sx = state.scratch
    holders = sx.node_holders.get(node.name)
    if holders is None:
        jobs = state.canonical.jobs
        holders = sx.node_holders[node.name] = [
            (j, len(gpus_on(jobs[j], node.name))) for j in ix.jobs_by_node.get(node.name, {})
        ]
    memo = sx.remaining_memo
    estimates = state.canonical.estimates
    specs = []
    for job_id, gpus in holders:
        spec = memo.get(job_id)
        if spec is None or estimates.get(spec[4]) is not spec[5]:
            spec = memo[job_id] = release_spec(state, state.canonical.jobs[job_id])
        specs.append((spec, gpus))
    return specs
