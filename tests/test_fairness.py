"""The fairness limits (core/rules/fairness.py), as tables: counts scaled to the pool and to
a team's share of the demand, when a team's quota recovers, and a user's allowance."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Window
from core.rules.fairness import (
    USER_PREEMPTING,
    describe_user_preempting,
    quota_recovers_t,
    scaled_limit,
    team_limit,
    user_preempting_limit,
)
from scenario import HOUR, Run, node, start_all, submit


def pool(nodes: int, **policy):
    run = Run(**policy)
    run.at(0, *[node(f"n{i}") for i in range(nodes)])
    return run


@pytest.mark.parametrize(("nodes", "per_100", "limit"), [(1, 4, 4), (25, 4, 8), (50, 4, 16), (125, 0, 0)])
def test_scaled_limit_table(nodes, per_100, limit):
    assert scaled_limit(pool(nodes).state, per_100) == limit


def test_a_team_bringing_most_of_the_demand_gets_most_of_the_allowance():
    run = pool(2)
    run.at(1000, submit("big", 6, 12, team="big", user="b", est_runtime_s=36000))
    run.at(1000, submit("small", 6, 4, team="small", user="s", est_runtime_s=36000))
    start_all(run, 2000)
    state = run.state
    # two teams with demand, 16 GPUs: big holds 12, so 4 * 12 * 2 // 16 = 6; small keeps the base
    assert (team_limit(state, "big", 4), team_limit(state, "small", 4)) == (6, 4)


@pytest.mark.parametrize(
    ("times", "limit", "window", "recovers"),
    [
        ([], 2, 100, 0),
        ([10], 2, 100, 0),  # under the limit already
        ([10, 20], 2, 100, 110),  # once the oldest leaves, one is left: under two
        ([10, 20, 30], 2, 100, 120),
        ([10, 20], 0, 100, 120),  # a limit of 0 counts as 1
    ],
)
def test_quota_recovers_t_table(times, limit, window, recovers):
    assert quota_recovers_t(times, limit, window) == recovers


@pytest.mark.parametrize(
    ("preempting", "limit"), [([], ""), ([HOUR - 10], ""), ([HOUR - 20, HOUR - 10], USER_PREEMPTING)]
)
def test_user_preempting_limit_table(preempting, limit):
    run = pool(1, user_preempting_max=2)
    state = run.state
    state.canonical.t = HOUR
    state.canonical.user_windows["u1"] = Window(preempting=preempting)
    run.at(HOUR, submit("j", 1, 1, team="t", user="u1"))
    job = state.canonical.jobs["j"]
    assert user_preempting_limit(state, job) == limit
    if limit:
        assert "user u1 has preempted others' jobs 2 times" in describe_user_preempting(state, job)


def test_preemptions_older_than_the_window_do_not_count():
    run = pool(1, user_preempting_max=1)
    state = run.state
    run.at(2 * HOUR, submit("j", 1, 1, team="t", user="u1"))
    state.canonical.user_windows["u1"] = Window(preempting=[10])
    assert user_preempting_limit(state, msgspec.structs.replace(state.canonical.jobs["j"])) == ""
