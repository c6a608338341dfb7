"""Scenario tests of the teams' cross-pool fair-share guarantee, the operators' opt-in
(`fair_share_guarantee = true`; off by default): given inputs, expect events.

A team below its max-min fair share reclaims GPUs from teams above theirs; a team within
its share is not preempted by other teams' non-urgent jobs; the urgent levels stay outside.
"""

import pytest

from core import types as T
from core.model.policy import PolicyError, with_params
from core.rules.shares import fair_shares

from scenario import HOUR, MIN, check_invariants, node, of, start_all, submit, tick
from scenario import Run as ScenarioRun


def Run(policy=None, **params) -> ScenarioRun:
    """A scenario run with the opt-in guarantee on, which this module is about."""
    params.setdefault("fair_share_guarantee", True)
    return ScenarioRun(policy, **params)


def big_team_holds_the_pool(level: int = 4, **params) -> Run:
    """Two 8-GPU nodes, all held by team big's four 4-GPU jobs, big asking for more."""
    run = Run(**params)
    run.at(0, node("n0"), node("n1"))
    run.at(
        1000,
        *[
            submit(
                f"big-{i}",
                level,
                4,
                team="big",
                user=f"b{i}",
                est_runtime_s=10 * 3600,
                ckpt_interval_s=600,
                ckpt_cost_s=20,
                restore_cost_s=20,
            )
            for i in range(4)
        ],
    )
    start_all(run, 2000)
    run.at(3000, submit("big-more", 4, 8, team="big", user="b9", est_runtime_s=3600))
    return run


def test_fair_shares_fill_small_demands_first_and_split_the_rest_by_quota():
    run = Run(team_quota={"a": 2.0})
    run.at(0, *[node(f"n{i}") for i in range(4)])  # 32 GPUs
    run.at(
        1000,
        submit("tiny", 5, 2, team="tiny"),
        *[submit(f"a-{i}", 5, 8, team="a") for i in range(4)],
        *[submit(f"b-{i}", 5, 8, team="b") for i in range(4)],
    )
    shares = fair_shares(run.state)
    assert shares["tiny"] == 2  # asks for less than a third: gets all it asks
    assert shares["a"] == pytest.approx(20.0) and shares["b"] == pytest.approx(10.0)  # 2:1 by quota


def test_a_team_below_its_share_reclaims_gpus_from_a_team_above_it_whatever_the_levels():
    run = big_team_holds_the_pool()
    events = run.at(20 * MIN, submit("small-1", 6, 4, team="small", user="s"))
    plans = of(events, T.PreemptionPlanned)
    assert len(plans) == 1 and plans[0].reclaim
    assert plans[0].preemptor == "small-1" and run.job(plans[0].victims[0]).team == "big"
    assert plans[0].reason.startswith("reclaim: team small holds 0 of its fair share 4.0 GPUs")
    check_invariants(run.state)
    # The victim lets go; the level-6 job starts on GPUs a level-4 job held.
    victim = plans[0].victims[0]
    done = run.at(20 * MIN + 30_000, T.SafePoint(job=victim), T.Released(job=victim))
    assert of(done, T.PreemptionCommitted)
    assert [e.job for e in of(done, T.JobStartRequested)] == ["small-1"]


def test_without_the_guarantee_a_low_level_job_waits_behind_other_teams():
    run = big_team_holds_the_pool(fair_share_guarantee=False)
    events = run.at(20 * MIN, submit("small-1", 6, 4, team="small", user="s"))
    events += run.at(21 * MIN, tick(21 * MIN))
    assert not of(events, T.PreemptionPlanned)


def test_a_team_reclaims_up_to_its_share_and_no_further():
    run = big_team_holds_the_pool()
    reclaims = []
    for i in range(3):
        t = (20 + i) * MIN
        events = run.at(t, submit(f"small-{i}", 6, 4, team="small", user=f"s{i}"))
        for plan in of(events, T.PreemptionPlanned):
            reclaims.append(plan.preemptor)
            run.at(t + 30_000, *[T.Released(job=v) for v in plan.victims])
    run.at(30 * MIN, tick(30 * MIN))
    # small asks for 12, big for 24: 8 GPUs each. Two 4-GPU jobs fill small's share.
    assert reclaims == ["small-0", "small-1"]
    assert run.job_state("small-2") == "queued"
    check_invariants(run.state)


def test_reclaimed_gpus_do_not_move_back():
    """After a reclaim both teams sit at their shares: big's requeued victim, though of a
    more urgent level, may not take them back by priority nor by reclaim."""
    run = big_team_holds_the_pool(level=2)
    t = 20 * MIN
    for i in range(2):
        plan = of(run.at(t, submit(f"small-{i}", 6, 4, team="small", user=f"s{i}")), T.PreemptionPlanned)[0]
        run.at(t + 30_000, *[T.Released(job=v) for v in plan.victims])
        t += MIN
    events = []
    for k in range(10):
        events += run.at(t + k * MIN, tick(t + k * MIN))
    assert not of(events, T.PreemptionPlanned)
    assert run.job_state("small-0") in ("starting", "running")


def test_a_team_within_its_share_is_not_preempted_by_another_teams_non_urgent_job():
    run = Run()
    run.at(0, node("n0"), node("n1"))
    run.at(
        1000,
        submit("small", 6, 8, team="small", user="s", est_runtime_s=10 * 3600),
        submit("big-0", 6, 8, team="big", user="b", est_runtime_s=10 * 3600),
    )
    start_all(run, 2000)
    run.at(20 * MIN - 1000, T.CheckpointSaved(job="small", step=1, digest="sha256:aa", bytes=1))
    # big's level-2 job may preempt levels 4-7 by priority, and small, fresh from a
    # checkpoint, would be the cheaper victim; but small holds no more than its share.
    events = run.at(20 * MIN, submit("big-urgentish", 2, 8, team="big", user="b2", est_runtime_s=600))
    plans = of(events, T.PreemptionPlanned)
    assert [p.victims for p in plans] == [["big-0"]]


def test_urgent_levels_preempt_whatever_the_shares():
    run = Run()
    run.at(0, node("n0"))
    run.at(1000, submit("small", 6, 8, team="small", user="s", est_runtime_s=10 * 3600))
    start_all(run, 2000)
    run.at(3000, submit("big-queued", 5, 8, team="big", user="b", est_runtime_s=3600))
    events = run.at(20 * MIN, submit("fix", 0, 8, team="big", user="f", est_runtime_s=600))
    plans = of(events, T.PreemptionPlanned)
    assert [(p.preemptor, p.victims, p.reclaim) for p in plans] == [("fix", ["small"], False)]


def test_urgent_jobs_are_never_reclaimed():
    run = big_team_holds_the_pool(level=1)
    events = run.at(20 * MIN, submit("small-1", 6, 4, team="small", user="s"))
    events += run.at(21 * MIN, tick(21 * MIN))
    assert not of(events, T.PreemptionPlanned)
    assert [d.reason for d in of(events, T.PreemptionDeclined)] == ["no_eligible_victims"]


def test_a_reclaim_counts_toward_no_teams_fairness_window():
    run = big_team_holds_the_pool(team_preempted_max=1)
    for i in range(2):
        t = (20 + i) * MIN
        plan = of(run.at(t, submit(f"small-{i}", 6, 4, team="small", user=f"s{i}")), T.PreemptionPlanned)[0]
        run.at(t + 30_000, *[T.Released(job=v) for v in plan.victims])
    windows = run.state.canonical.team_windows
    assert "big" not in windows or not windows["big"].preempted
    assert "small" not in windows or not windows["small"].preempting
    assert not run.events(T.TeamProtected) and not run.events(T.TeamDowngraded)


def test_a_bad_fair_share_level_is_refused_with_what_to_fix():
    with pytest.raises(PolicyError, match="fair_share_from_level must be 0..8"):
        with_params(Run().state.canonical.policy, {"fair_share_from_level": 9})


def test_a_team_asking_for_one_gpu_reclaims_it():
    """Its share is all it asks for, one GPU: nothing is left over to be below by."""
    run = big_team_holds_the_pool()
    plans = of(run.at(20 * MIN, submit("one", 7, 1, team="tiny", user="t")), T.PreemptionPlanned)
    assert [(p.preemptor, p.reclaim) for p in plans] == [("one", True)]


def test_freed_gpus_go_first_to_a_team_below_its_share_then_by_level():
    """Eight GPUs free up; team big queues eight level-4 jobs, team small one level-7 job.
    small's share is the one GPU it asks for, big's the other seven: both are below their
    shares, and the next GPU goes to the team furthest below (ties by name), whatever the
    levels. Without the guarantee, big's more urgent jobs take every GPU."""

    def started_when_busy_ends(**params) -> list[str]:
        run = Run(**params)
        run.at(0, node("n0"))
        run.at(1, submit("busy", 1, 8, team="ops", user="o", est_runtime_s=3600))
        start_all(run, 2)
        run.at(
            10,
            *[submit(f"big-{i}", 4, 1, team="big", user="b") for i in range(8)],
            submit("small", 7, 1, team="small", user="s"),
        )
        events = run.at(3600_000, T.Finished(job="busy", ok=True))
        return [e.job for e in of(events, T.JobStartRequested)]

    assert started_when_busy_ends() == ["big-0", "small"] + [f"big-{i}" for i in range(1, 7)]
    assert started_when_busy_ends(fair_share_guarantee=False) == [f"big-{i}" for i in range(8)]


def test_jobs_aged_into_the_urgent_levels_do_not_go_ahead_of_a_team_below_its_share():
    """As above, but big's jobs are of level 2 and have waited long enough to age into the
    urgent levels: aging bounds their wait within the levels, it does not make them urgent,
    so small still gets its GPU. Real urgent jobs still come first."""
    run = Run()
    run.at(0, node("n0"))
    run.at(1, submit("busy", 1, 8, team="ops", user="o", est_runtime_s=3600))
    start_all(run, 2)
    run.at(
        10,
        *[submit(f"big-{i}", 2, 1, team="big", user="b") for i in range(8)],
        submit("small", 7, 1, team="small", user="s"),
    )
    for minute in range(1, 60):
        run.at(minute * MIN, tick(minute * MIN))
    assert run.job("big-0").eff_level < 2  # aged
    run.at(HOUR - 1000, submit("urgent", 0, 1, team="ops", user="o2"))
    events = run.at(HOUR, T.Finished(job="busy", ok=True))
    assert [e.job for e in of(events, T.JobStartRequested)] == ["urgent", "big-0", "small"] + [
        f"big-{i}" for i in range(1, 6)
    ]
