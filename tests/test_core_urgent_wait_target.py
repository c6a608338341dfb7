"""The urgent levels' wait target and its price: an urgent job's
wait has a target (`urgent_wait_target_s`, an SLO), and each second of its wait past the
target weighs `urgent_overdue_factor` times its level's weight. One scenario per rule,
named after it."""

from core import types as T
from core.model.policy import Policy, PolicyError, validate, with_params
from core.rules.pricing import wait_priced_s

import pytest

from scenario import HOUR, Run, node, of, start_all, submit


def test_a_second_of_urgent_wait_past_the_target_weighs_the_overdue_factor_more():
    """Levels 0-1: 30 s at the level's weight, every second past them 8 times as much;
    level 2 and on: every second once."""
    p = Policy()
    assert (p.urgent_wait_target_s, p.urgent_overdue_factor) == (30.0, 8.0)
    assert wait_priced_s(p, 1, 20_000) == 20.0
    assert wait_priced_s(p, 1, 40_000) == 30.0 + 8 * 10.0
    assert wait_priced_s(p, 0, 40_000) == 110.0
    assert wait_priced_s(p, 2, 40_000) == 40.0  # not an urgent level: every second once
    assert wait_priced_s(with_params(p, {"urgent_overdue_factor": 1.0}), 1, 40_000) == 40.0


def test_the_wait_target_and_factor_are_checked():
    """A negative target or a factor below 1 is refused, naming the field."""
    for bad in ({"urgent_wait_target_s": -1.0}, {"urgent_overdue_factor": 0.5}):
        with pytest.raises(PolicyError):
            validate(with_params(Policy(), bad))


def _urgent_job_behind_a_release(
    level: int = 1, seconds_to_release: int = 3600, victim_unsaved_s: int = 36_000, backlog: int = 0, **params
):
    """a1's 8 GPUs: seven held by level-0 jobs of another team that end in
    `seconds_to_release` (their estimate, a tenth of which is left); one by a level-6 job
    that never checkpoints but once, `victim_unsaved_s` ago, 100 h into a 200-h run.
    `backlog` level-6 gangs queue for the B node, which is down (the queue's pressure). A
    ten-minute one-GPU job of `level` arrives: it fits when the level-0 jobs end, or at
    once by preempting the level-6 job. Its plans and its last decline."""
    run = Run(**params)
    run.at(0, node("a1"), node("b1", "B"))
    run.at(1, T.NodeDown(node="b1"))
    run.at(1000, submit("victim", 6, 1, team="v", user="v", est_runtime_s=200 * 3600, ckpt_interval_s=0))
    start_all(run, 2000)
    t = 2000 + 100 * HOUR
    estimate_s = 10 * seconds_to_release
    fix_started = t - (estimate_s - seconds_to_release) * 1000
    saved = [
        (t - 2 - victim_unsaved_s * 1000, T.CheckpointSaved(job="victim", step=1, digest="sha256:v", bytes=1))
    ]
    fixes = [
        (
            fix_started - 1000,
            *[submit(f"fix-{i}", 0, 1, team="f", user=f"f{i}", est_runtime_s=estimate_s) for i in range(7)],
        )
    ]
    queued = [(t - 1, *[submit(f"q{i}", 6, 8, team="q", user=f"q{i}", models=["B"]) for i in range(backlog)])]
    for at, *inputs in sorted(saved + fixes + queued, key=lambda item: item[0]):
        run.at(at, *inputs)
        if at == fix_started - 1000:
            start_all(run, fix_started)
    events = run.at(t, submit("urgent", level, 1, team="u", user="u", est_runtime_s=600))
    return [p.victims for p in of(events, T.PreemptionPlanned)], run.job("urgent").last_decline


def test_the_overdue_price_buys_no_unsaved_work():
    """An hour's natural wait for a level-1 job, past its 30-s target: the seconds past it
    pay for a victim's disruption (save, restore, overhead, its requeue wait), not for
    progress thrown away, which the pool must redo whatever the urgency: the victim's
    10 h of unsaved work is judged against the plain hour saved, as without a target."""
    assert _urgent_job_behind_a_release() == ([], "benefit_below_cost")
    assert _urgent_job_behind_a_release(urgent_overdue_factor=1.0) == ([], "benefit_below_cost")
    assert _urgent_job_behind_a_release(victim_unsaved_s=3600) == ([["victim"]], "")


def test_a_less_urgent_job_has_no_wait_target():
    """A minute's wait for a level-2 job (which may preempt level 6) under load is weighed
    once a second: not worth even a freshly saved victim's restore at the queue's pressure;
    the same minute of a level-1 job, past its target, is."""
    fresh = dict(seconds_to_release=60, victim_unsaved_s=0, backlog=100)
    assert _urgent_job_behind_a_release(level=2, **fresh) == ([], "benefit_below_cost")
    assert _urgent_job_behind_a_release(level=1, **fresh) == ([["victim"]], "")


def test_an_urgent_job_that_would_pass_its_target_preempts_a_freshly_saved_victim_at_any_load():
    """The level-0 jobs end in a minute, the victim saved a checkpoint just now. Without the
    target the verdict flips with load: idle, the minute saved is worth the restore; with
    a hundred gangs queued, the queue's pressure makes the wasted restore dearer than the
    minute. Past the 30-s target the minute's second half weighs the overdue factor more:
    it preempts at either load."""
    fresh = dict(seconds_to_release=60, victim_unsaved_s=0)
    assert _urgent_job_behind_a_release(**fresh) == ([["victim"]], "")
    assert _urgent_job_behind_a_release(backlog=100, **fresh) == ([["victim"]], "")
    flat = dict(urgent_overdue_factor=1.0, **fresh)
    assert _urgent_job_behind_a_release(**flat) == ([["victim"]], "")
    assert _urgent_job_behind_a_release(backlog=100, **flat) == ([], "benefit_below_cost")
