"""Scenario tests of two opt-ins that keep a job's rise inside its band of levels: the
recovery boost within the victim's band (`recovery_boost_within_band`,
core/rules/recovery.py) and no head reservation for a job queued above its own level
(`head_reservation_own_level_only`, core/rules/holds.py `may_hold_as_head`)."""

from core import types as T
from core.explain import explain
from core.model.policy import Policy
from core.passes.placement import reserved_nodes
from core.model.bands import band_top, requeue_boost

from scenario import HOUR, MIN, Run, node, of, start_all, submit, tick


def started_order(events) -> list[str]:
    return [e.job for e in of(events, T.JobStartRequested)]


def test_the_recovery_boost_stops_at_the_top_of_the_victims_band():
    p = Policy(recovery_boost_within_band=True)
    assert [band_top(p, level) for level in range(8)] == [0, 0, 2, 3, 3, 3, 6, 6]
    assert requeue_boost(p, 7, 3) == (1, "recovery_boost_within_band")
    assert requeue_boost(p, 5, 2) == (2, "recovery_boost")
    assert requeue_boost(p, 3, 1) == (0, "recovery_boost_within_band")
    assert requeue_boost(Policy(), 3, 1) == (1, "recovery_boost")


def _victim_back_beside_an_older_job(**params) -> Run:
    """A level-3 job of team b waits, held by its user, while a later level-3 job of team a
    starts on a1, the only node; then b's is let go. A level-0 job preempts a's job: once
    the level-0 job ends, which of the two level-3 jobs starts?"""
    run = Run(fair_share_guarantee=False, **params)
    run.at(0, node("a1"))
    run.at(1, submit("blocker", 1, 8, team="z", user="uz", est_runtime_s=600))
    start_all(run, 2)
    run.at(3, submit("older", 3, 8, team="b", user="ub", est_runtime_s=3600))
    run.at(4, T.Hold(job="older", by="ub"))
    run.at(5, submit("victim", 3, 8, team="a", user="ua", est_runtime_s=3600, ckpt_interval_s=60))
    run.at(10 * MIN, T.Finished(job="blocker", ok=True))
    start_all(run, 10 * MIN + 1)
    run.at(10 * MIN + 2, T.ReleaseHold(job="older", by="ub"))
    plans = of(
        run.at(20 * MIN, submit("urgent", 0, 8, team="u", user="uu", est_runtime_s=600)), T.PreemptionPlanned
    )
    assert [plan.victims for plan in plans] == [["victim"]]
    run.at(20 * MIN + 1000, T.Released(job="victim"))
    start_all(run, 20 * MIN + 2000)
    assert run.job_state("victim") == "queued" and run.job_state("urgent") == "running"
    return run


def test_a_victim_boosted_within_its_band_queues_by_its_own_levels_order():
    """By default the level-3 victim comes back one level up (level 2) and takes a1 before
    the older level-3 job; boosted within its band (levels 3-5) it stays at level 3, where
    the older job of a team holding as little goes first."""
    default = _victim_back_beside_an_older_job()
    requeued = of(default.events(), T.JobRequeued)[-1]
    assert (requeued.job, requeued.boost) == ("victim", 1)
    assert started_order(default.at(default.t + HOUR, T.Finished(job="urgent", ok=True))) == ["victim"]
    band = _victim_back_beside_an_older_job(recovery_boost_within_band=True)
    requeued = of(band.events(), T.JobRequeued)[-1]
    assert (requeued.job, requeued.boost) == ("victim", 0)
    assert "recovery_boost_within_band" in explain(band.state, "victim").reason
    assert "recovery_boost_within_band" not in explain(default.state, "older").reason
    assert started_order(band.at(band.t + HOUR, T.Finished(job="urgent", ok=True))) == ["older"]


def _aged_gang_at_the_head(**params) -> Run:
    """a1 runs a level-3 job on 6 GPUs for ten hours (2 free); a level-4 gang of 8 waits for
    it, heads the serving order and, after its level's aging threshold, queues at level 3."""
    run = Run(fair_share_guarantee=False, **params)
    run.at(0, node("a1"))
    run.at(1, submit("long", 3, 6, team="ops", est_runtime_s=10 * 3600, preemptible=False))
    start_all(run, 2)
    run.at(10, submit("gang", 4, 8, team="g", est_runtime_s=3600))
    run.at(40 * MIN, tick(40 * MIN))
    assert run.job("gang").eff_level == 3
    return run


def test_a_gang_aged_above_its_level_holds_no_head_reservation_when_asked():
    """By default the aged gang holds a1 as the head, and a level-6 job that would outlast
    the hold may not take a1's free GPUs; with `head_reservation_own_level_only` the gang
    (not yet starving) holds nothing and the level-6 job starts."""
    default = _aged_gang_at_the_head()
    assert reserved_nodes(default.state)["a1"][1] == "gang"
    assert (
        started_order(default.at(45 * MIN, submit("filler", 6, 2, team="f", est_runtime_s=20 * 3600))) == []
    )
    own = _aged_gang_at_the_head(head_reservation_own_level_only=True)
    assert "head_reservation_own_level_only" in explain(own.state, "gang").reason
    assert started_order(own.at(45 * MIN, submit("filler", 6, 2, team="f", est_runtime_s=20 * 3600))) == [
        "filler"
    ]
