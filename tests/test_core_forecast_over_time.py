"""A node's release forecast kept across time (core.node_fit.NodeFit) gives, at every later
time, the same fit as working the node's releases out again at that time."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import forecast as F
from core import node_fit as N

# A holding job's release spec (core.forecast.release_spec): fixed, or running with an
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
        if t >= line[2]:  # as core.node_fit.node_fit_ms: the line no longer tells, start again
            fit = _Fit(free, specs, t)
            line = fit.line(need)
            assert t < line[2]
        fit.lines[need] = line
        kept = None if line[1] is None else line[0] + line[1] * t
        assert kept == _fit_worked_out_at(t, free, specs, need)
