"""Scenario tests: fair share inside a level weighs each team's use over time when
`fair_share_half_life_s` is set (given inputs, expect the order jobs start in)."""

from core import types as T
from core.model.usage import decayed_gpu_ms, mean_gpus
from core.model.entities import Usage

from scenario import MIN, Run, node, submit

WEEK_S = 7 * 24 * 3600


def start_order(jobs: int = 12, **params) -> list[str]:
    """Team A (quota 3) and team B (quota 1) at level 4 on one GPU: B's four jobs submitted
    first, then A's eight; each runs five minutes (all twelve within the hour, before any
    waits long enough to be served as starving). The order the jobs start in."""
    run = Run(team_quota={"A": 3.0, "B": 1.0}, **params)
    run.at(0, node("g1", gpus=1))
    for i in range(4):
        run.at(1000 + i, submit(f"b{i + 1}", 4, 1, team="B", user="bo", est_runtime_s=300))
    for i in range(8):
        run.at(2000 + i, submit(f"a{i + 1}", 4, 1, team="A", user="al", est_runtime_s=300))
    order: list[str] = []
    t = 3000
    for _ in range(jobs):
        starting = [e.job for e in run.events(T.JobStartRequested) if e.job not in order]
        assert len(starting) == 1, starting
        order.append(starting[0])
        run.at(t, T.Started(job=starting[0]))
        t += 5 * MIN
        run.at(t, T.Finished(job=starting[0], ok=True))
    return order


def test_without_a_half_life_one_job_at_a_time_is_first_come_first_served():
    assert start_order(fair_share_half_life_s=0) == [
        "b1",
        "b2",
        "b3",
        "b4",
        "a1",
        "a2",
        "a3",
        "a4",
        "a5",
        "a6",
        "a7",
        "a8",
    ]


def test_with_a_half_life_a_is_served_three_times_for_each_of_bs():
    order = start_order(fair_share_half_life_s=WEEK_S)
    # Every four starts, one of B's and three of A's (A's quota is three times B's): B's
    # first job starts first (nobody had run yet), then each team is served by its use.
    for served in (4, 8):
        assert sum(job.startswith("b") for job in order[:served]) == served // 4, order
    assert order[:4] == ["b1", "a1", "a2", "a3"]


def test_decayed_use_halves_every_half_life_and_reads_as_the_gpus_held_on_average():
    h = 1000.0
    assert decayed_gpu_ms(Usage(gpu_ms=800.0, t=0), 0, 1000, h) == 400.0
    assert decayed_gpu_ms(None, 4, 0, h) == 0.0
    forever = decayed_gpu_ms(Usage(gpu_ms=0.0, t=0), 4, 10**9, h)
    assert abs(mean_gpus(forever, h) - 4) < 1e-9
    assert decayed_gpu_ms(Usage(gpu_ms=5.0, t=0), 2, 100, 0) == 0.0  # no half-life: no use kept


def test_the_shares_view_shows_each_teams_standing_by_the_same_rule():
    from projections.views import share_rows

    run = Run(team_quota={"A": 3.0, "B": 1.0}, fair_share_half_life_s=WEEK_S)
    run.at(0, node("g1", gpus=1))
    run.at(1000, submit("b1", 4, 1, team="B", user="bo", est_runtime_s=300))
    run.at(2000, T.Started(job="b1"))
    run.at(2000 + 5 * MIN, T.Finished(job="b1", ok=True))
    run.at(2000 + 5 * MIN, submit("a1", 4, 1, team="A", user="al", est_runtime_s=300))
    levels = {r["team"]: r.get("levels") for r in share_rows(run.state)}
    b = levels["B"]["4"]
    assert b["held_gpus"] == 0 and b["by"] == "held_and_used"
    assert 0 < b["used_gpus_lately"] < 0.001  # five minutes of one GPU, over a week's half-life
    assert levels["A"]["4"]["held_gpus"] == 1  # a1 started at once: the pool was free


def test_by_default_the_issues_example_serves_a_three_times_for_each_of_bs():
    """This release's defaults (version 2) weigh a week of decayed use."""
    from core.model.policy import Policy

    assert Policy().fair_share_half_life_s == WEEK_S
    assert start_order() == start_order(fair_share_half_life_s=WEEK_S)
