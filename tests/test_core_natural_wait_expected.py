"""The natural wait below the urgent levels as the expectation over uncertain releases
(core/forecast/waits.py `expected_first_fit_ms`, `ReleaseCurve`): a running job's
remaining time is known only by its expectation m, so it releases at rate 1/m (the
exponential law, which assumes nothing more); the job's own fit is the expected FIRST of
many releases, and the GPUs queued ahead drain at the pool's turnover, the sum of GPUs / m.
The urgent levels keep the soonest point estimate and the median pace."""

from core.forecast.waits import natural_wait_ms, remaining_or_runtime

from scenario import HOUR, MIN, Run, node, start_all, submit

# Only the forecast is looked at, read at the exact time (on a grid, `release_curve_grid_ms`,
# each release is off by less than a step: tests/test_core_release_pool.py).
NOBODY_PREEMPTS = dict(preempts_from_level=[8] * 8, release_curve_grid_ms=0)


def _pool_of_one_gpu_jobs(hours: list[float]) -> Run:
    """Four 8-GPU nodes, each GPU held by a one-GPU level-6 job of the given estimates."""
    run = Run(**NOBODY_PREEMPTS)
    run.at(0, *[node(f"a{i}") for i in range(4)])
    run.at(
        1000,
        *[
            submit(f"run-{i:02d}", 6, 1, team="r", user=f"r{i}", est_runtime_s=int(h * 3600))
            for i, h in enumerate(hours)
        ],
    )
    start_all(run, 2000)
    return run


def test_below_the_urgent_levels_the_first_of_many_uncertain_releases_comes_sooner_than_the_soonest():
    """32 running jobs, the soonest expected to end in 9 h: one of the 32 ends much sooner
    in expectation (1 / the sum of their rates: ~0.6 h), and a level-3 job is forecast that;
    a level-1 job keeps the soonest point estimate."""
    run = _pool_of_one_gpu_jobs([10 + i for i in range(32)])
    t = HOUR
    run.at(t, submit("mid", 3, 1, team="m", user="m"))
    nodes = [run.state.canonical.nodes[f"a{i}"] for i in range(4)]
    remaining = [remaining_or_runtime(run.state, f"run-{i:02d}") for i in range(32)]
    soonest = min(remaining)
    expected_first = int(1.0 / sum(1.0 / m for m in remaining))
    assert soonest > 8 * HOUR
    mid = natural_wait_ms(run.state, run.job("mid"), nodes)
    assert abs(mid - expected_first) <= 1000
    assert mid < HOUR
    run.at(t, submit("urgent", 1, 1, team="u", user="u"))
    assert natural_wait_ms(run.state, run.job("urgent"), nodes) == soonest


def test_below_the_urgent_levels_the_gpus_ahead_drain_at_the_pools_turnover():
    """Half the pool's GPUs turn over every 20 minutes, the other half in 40 hours; 20
    one-GPU level-2 jobs queue ahead of a level-3 job. Each running job released once, the
    21st release is a 40-hour job's; but the short jobs' GPUs are freed again and again:
    at the pool's turnover (16 GPUs every 20 minutes and a little) 21 GPUs take ~26 minutes."""
    run = _pool_of_one_gpu_jobs([1 / 3] * 16 + [40] * 16)
    t = 2000 + MIN // 10  # the short jobs' remaining time is near their estimate
    run.at(t, *[submit(f"ahead-{i}", 2, 1, team="q", user=f"q{i}") for i in range(20)])
    run.at(t, submit("mid", 3, 1, team="m", user="m"))
    nodes = [run.state.canonical.nodes[f"a{i}"] for i in range(4)]
    turnover = sum(1.0 / remaining_or_runtime(run.state, f"run-{i:02d}") for i in range(32))
    mid = natural_wait_ms(run.state, run.job("mid"), nodes)
    assert abs(mid - int(21 / turnover)) <= 1000
    assert mid < HOUR


def _fast_turning_pool(level: int = 2):
    """a0-a2 (24 GPUs): eight one-GPU level-1 jobs end in about 20 minutes, fifteen in 20 h,
    and a level-6 job that never checkpoints is 10 h into a 100-h run. Twelve one-GPU
    level-1 jobs queue for the B node, which is down (GPUs ahead that cannot preempt here).
    A one-GPU job of `level` arrives: its natural wait, its plans and its last decline."""
    from core import types as T
    from scenario import of

    run = Run()
    run.at(0, node("a0"), node("a1"), node("a2"), node("b1", "B"))
    run.at(1, T.NodeDown(node="b1"))
    run.at(
        1000, *[submit(f"long-{i}", 1, 1, team="l", user=f"l{i}", est_runtime_s=50 * 3600) for i in range(15)]
    )
    start_all(run, 2000)
    t = 2000 + 30 * HOUR
    run.at(
        t - 10 * HOUR, submit("victim", 6, 1, team="v", user="v", est_runtime_s=100 * 3600, ckpt_interval_s=0)
    )
    start_all(run, t - 10 * HOUR)
    run.at(
        t - MIN,
        *[submit(f"short-{i}", 1, 1, team="s", user=f"s{i}", est_runtime_s=20 * 60) for i in range(8)],
    )
    start_all(run, t - MIN)
    run.at(t - 30_000, *[submit(f"ahead-{i}", 1, 1, team="q", user=f"q{i}", models=["B"]) for i in range(12)])
    events = run.at(t, submit("mid", level, 1, team="m", user="m", est_runtime_s=3600))
    nodes = [run.state.canonical.nodes[n] for n in ("a0", "a1", "a2")]
    wait = natural_wait_ms(run.state, run.job("mid"), nodes)
    return wait, [p.victims for p in of(events, T.PreemptionPlanned)], run.job("mid").last_decline


def test_a_job_below_the_urgent_levels_does_not_throw_away_hours_of_work_for_a_queue_that_turns_over_fast():
    """The 13th release is a 20-h job's, and half the running jobs are long, so the median
    pace forecast the level-2 job 20 h of wait: worth 10 h of a never-checkpointed run
    (the class of decision that threw away 1,831 GPU-hours on Philly 0:10000 at 256 GPUs).
    The short jobs' GPUs turn over every 20 minutes: 13 GPUs free in ~30 minutes, and the
    10 h of work stay."""
    wait, plans, decline = _fast_turning_pool()
    assert wait < HOUR
    assert (plans, decline) == ([], "benefit_below_cost")
