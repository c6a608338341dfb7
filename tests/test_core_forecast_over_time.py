"""A node's release forecast kept across time (core.forecast.node_fit.NodeFit) gives, at every later
time, the same fit as working the node's releases out again at that time."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.forecast import waits as F
from core.forecast import node_fit as N

# A holding job's release spec (core.forecast.waits.release_spec): fixed, or running with an
# expected total, progress done at `since`; small scales reach the Lindy floor of 1 ms.
fixed_specs = st.builds(lambda ms: (ms, 0, 0, 0, "", None), st.integers(0, 3000))
running_specs = st.builds(
    lambda total, done, since: (-1, total, done, since, "", None),
    st.integers(1, 3000),
    st.integers(0, 3000),
    st.integers(0, 2000),
)
holders = st.lists(st.tuples(st.one_of(fixed_specs, running_specs), st.integers(1, 4)), max_size=8)


class _Fit(N.NodeFit):
    """A NodeFit over given specs (the real one reads them from a state's node)."""

    __slots__ = ()

    def __init__(self, free: int, specs: list, t0: int) -> None:
        self.t0 = t0
        self.free = free
        self.lines = {}
        self.order = sorted(
            ((*N._release_piece(spec, t0, F.LINDY_FLOOR_FRACTION), gpus) for spec, gpus in specs),
            key=lambda p: (p[0] + p[1] * t0, p[1]),
        )


def _fit_worked_out_at(t: int, free: int, specs: list, need: int) -> int | None:
    releases = sorted((F.remaining_at(spec, t), gpus) for spec, gpus in specs)
    return F._first_fit_time(free, releases, need)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=holders,
    free=st.integers(0, 3),
    need=st.integers(1, 9),
    t0=st.integers(0, 5000),
    steps=st.lists(st.integers(0, 1500), min_size=1, max_size=25),
)
def test_a_kept_node_forecast_matches_one_worked_out_again_at_every_later_time(specs, free, need, t0, steps):
    fit = _Fit(free, specs, t0)
    t = t0
    for step in steps:
        t += step
        line = fit.lines.get(need) or fit.line(need)
        if t >= line[2]:  # as core.forecast.node_fit.node_fit_ms: the line no longer tells, start again
            fit = _Fit(free, specs, t)
            line = fit.line(need)
            assert t < line[2]
        fit.lines[need] = line
        kept = None if line[1] is None else line[0] + line[1] * t
        assert kept == _fit_worked_out_at(t, free, specs, need)


# A running or frozen job's release forecast under two learned runtimes of its team and kind.
def _job(state_name: str, est_runtime_ms: int, progress_ms: int, run_started_t: int, frozen_t: int):
    from core.model.entities import Job

    return Job(
        id="j",
        team="a",
        user="u",
        kind="",
        level=4,
        requested_level=4,
        eff_level=4,
        gpus=1,
        gpu_models=[],
        est_runtime_ms=est_runtime_ms,
        ckpt_interval_ms=0,
        ckpt_cost_ms=0,
        restore_cost_ms=0,
        preemptible=True,
        state=state_name,
        progress_ms=progress_ms,
        run_started_t=run_started_t,
        frozen_t=frozen_t,
    )


@settings(max_examples=400, deadline=None)
@given(
    state_name=st.sampled_from(["running", "queued"]),
    est_runtime_ms=st.integers(1, 20_000),
    progress_ms=st.integers(0, 20_000),
    run_started_t=st.integers(0, 5000),
    frozen=st.booleans(),
    means=st.tuples(st.integers(1, 20_000), st.integers(1, 20_000)),
    samples=st.tuples(st.integers(0, 6), st.integers(0, 6)),
    t=st.integers(0, 40_000),
)
def test_a_forecast_moves_no_more_than_the_learned_runtime_it_uses(
    state_name, est_runtime_ms, progress_ms, run_started_t, frozen, means, samples, t
):
    """The premise of `core.forecast.node_fit.NodeFit.drift_ms`, which skips remaking a node's
    forecast after a learned runtime changed when a bound says it cannot be the soonest: a
    job's time to release moves by no more than its learned runtime did while that runtime
    is the one used, and does not move while the submitter's estimate is. (A rule that
    breaks this must make `drift_ms` say None for such jobs.)"""
    from core.forecast.release import release_spec, remaining_at
    from core.model.state import State
    from core.model.entities import Estimate

    frozen_t = run_started_t + 1 if frozen else 0
    job = _job(state_name, est_runtime_ms, progress_ms, run_started_t, frozen_t)
    values = []
    for mean, count in zip(means, samples):
        state = State()
        state.canonical.t = t
        state.canonical.estimates["a/"] = Estimate(samples=count, mean_ms=float(mean))
        values.append(remaining_at(release_spec(state, job), t))
    min_samples = State().canonical.policy.estimate_samples_min
    learned = [count >= min_samples for count in samples]
    if learned == [True, True]:
        assert abs(values[0] - values[1]) <= abs(means[0] - means[1])
    elif learned == [False, False]:
        assert values[0] == values[1]
