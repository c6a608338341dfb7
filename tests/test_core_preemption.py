"""Scenario tests of the preemption rules: given inputs, expect events."""

from core import new_state
from core import types as T
from core.passes.placement import reserved_nodes
from core.log.evolve import evolve
from projections.views import share_rows
from core.model.policy_deprecated import deprecation_notes

from scenario import HOUR, MIN, Run, check_invariants, node, of, start_all, started, submit, tick


def two_victims_on_one_node(**params) -> Run:
    run = Run(**params)
    run.at(0, node("a1", "A100"), node("h1", "H100"))
    run.at(
        1000,
        submit(
            "low-1", 6, 4, team="search", user="li", est_runtime_s=4 * 3600, ckpt_cost_s=15, restore_cost_s=10
        ),
        submit(
            "low-2", 6, 4, team="search", user="li", est_runtime_s=4 * 3600, ckpt_cost_s=15, restore_cost_s=10
        ),
    )
    start_all(run, 2000)
    return run


def test_multi_victim_preemption_commits_and_starts_preemptor_only_after_every_release():
    run = two_victims_on_one_node()
    planned = run.at(20 * MIN, submit("urgent", 1, 8, team="safety", user="ana", est_runtime_s=1800))
    plan = of(planned, T.PreemptionPlanned)
    assert len(plan) == 1 and plan[0].victims == ["low-1", "low-2"]
    assert plan[0].benefit > plan[0].cost > 0
    assert sorted(n.job for n in of(planned, T.VictimNotified)) == ["low-1", "low-2"]
    assert plan[0].placement == [T.Slot(node="a1", gpus=list(range(8)))]

    first = run.at(20 * MIN + 40_000, T.SafePoint(job="low-1"), T.Released(job="low-1"))
    assert not of(first, T.PreemptionCommitted)
    assert not [e for e in of(first, T.JobStartRequested) if e.job == "urgent"]
    assert run.job_state("urgent") == "reserved"
    check_invariants(run.state)

    second = run.at(20 * MIN + 50_000, T.Released(job="low-2"))
    kinds = [type(e).__name__ for e in second if not isinstance(e, T.InputAccepted)]
    assert kinds[:3] == ["VictimReleased", "PreemptionCommitted", "JobStartRequested"]
    assert sorted(e.job for e in of(second, T.JobRequeued)) == ["low-1", "low-2"]
    assert run.job_state("urgent") == "starting"
    assert run.job("low-1").state == "queued" and run.job("low-1").preempt_count == 1
    check_invariants(run.state)


def test_same_level_never_preempts():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("first", 1, 8, est_runtime_s=10 * 3600))
    start_all(run, 2000)
    events = run.at(HOUR, submit("second", 1, 8, team="t2", user="u2"))
    events += run.at(2 * HOUR, tick(2 * HOUR))
    assert not of(events, T.PreemptionPlanned)
    assert [e.reason for e in of(events, T.PreemptionDeclined)] == ["no_eligible_victims"]


def test_missed_deadline_rolls_everything_back_and_no_gpu_is_held_twice():
    run = two_victims_on_one_node()
    plan = of(run.at(20 * MIN, submit("urgent", 1, 8, team="safety", user="ana")), T.PreemptionPlanned)[0]
    run.at(
        20 * MIN + 30_000,
        T.SafePoint(job="low-1"),
        T.CheckpointSaved(job="low-1", step=10, digest="sha256:aa", bytes=100),
        T.Released(job="low-1"),
    )
    check_invariants(run.state)
    events = run.at(plan.deadline_t + 1, tick(plan.deadline_t + 1))
    rolled = of(events, T.PreemptionRolledBack)
    assert [r.reason for r in rolled] == ["deadline_passed"]
    assert [e.job for e in of(events, T.JobResumeRequested)] == ["low-1"]
    assert of(events, T.JobResumeRequested)[0].ckpt_digest == "sha256:aa"
    assert [e.job for e in of(events, T.NoticeWithdrawn)] == ["low-2"]
    assert not of(events, T.PreemptionPlanned), "no immediate retry after a rollback"
    assert run.job_state("urgent") == "queued"
    assert run.job_state("low-2") == "running"
    check_invariants(run.state)
    holders = run.state.canonical.nodes["a1"].holder
    assert holders == ["low-1"] * 4 + ["low-2"] * 4


def test_victim_writing_a_checkpoint_is_waited_for():
    run = two_victims_on_one_node()
    run.at(20 * MIN, T.CheckpointStarted(job="low-1"))
    # low-1 writes for 15 s; a preemption arriving 5 s in must wait for that checkpoint.
    events = run.at(20 * MIN + 5000, submit("urgent", 1, 8, team="safety", user="ana"))
    plan = of(events, T.PreemptionPlanned)[0]
    notices = {n.job: n for n in of(events, T.VictimNotified)}
    assert notices["low-1"].checkpoint_needed is False
    assert plan.deadline_t >= 20 * MIN + 15_000
    run.at(20 * MIN + 15_000, T.CheckpointSaved(job="low-1", step=7, digest="sha256:c1", bytes=1))
    run.at(20 * MIN + 16_000, T.Released(job="low-1"))
    done = run.at(
        20 * MIN + 60_000,
        T.SafePoint(job="low-2"),
        T.CheckpointSaved(job="low-2", step=7, digest="sha256:c2", bytes=1),
        T.Released(job="low-2"),
    )
    assert of(done, T.PreemptionCommitted)
    released = {e.job: e for e in run.events(T.VictimReleased)}
    assert released["low-1"].lost_progress_ms < 2000  # only the second after its checkpoint


def test_no_preemption_when_victim_finishes_in_seconds_and_would_lose_hours():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("long", 6, 8, team="search", est_runtime_s=4 * 3600, ckpt_interval_s=0))
    start_all(run, 1000)
    events = run.at(4 * HOUR - 10_000, submit("urgent", 1, 8, team="safety", user="ana"))
    assert not of(events, T.PreemptionPlanned)
    declined = of(events, T.PreemptionDeclined)
    assert declined and declined[0].reason == "benefit_below_cost"
    assert declined[0].cost > declined[0].benefit


def test_a_fresh_checkpoint_makes_a_victim_cheap():
    stale = two_victims_on_one_node()
    stale_plan = of(
        stale.at(20 * MIN, submit("urgent", 1, 8, team="safety", user="ana")), T.PreemptionPlanned
    )[0]
    fresh = two_victims_on_one_node()
    fresh.at(
        20 * MIN - 10_000,
        T.CheckpointSaved(job="low-1", step=3, digest="sha256:f1", bytes=1),
        T.CheckpointSaved(job="low-2", step=3, digest="sha256:f2", bytes=1),
    )
    events = fresh.at(20 * MIN, submit("urgent", 1, 8, team="safety", user="ana"))
    fresh_plan = of(events, T.PreemptionPlanned)[0]
    assert fresh_plan.cost < stale_plan.cost
    assert all(not n.checkpoint_needed for n in of(events, T.VictimNotified))


def preempt_cycle(run: Run, t: int, preemptor: str, team: str, user: str) -> T.PreemptionPlanned | None:
    plans = of(
        run.at(t, submit(preemptor, 1, 8, team=team, user=user, est_runtime_s=600)), T.PreemptionPlanned
    )
    return plans[0] if plans else None


def fill_nodes(run: Run, count: int, team: str = "research") -> None:
    run.at(0, *[node(f"n{i}") for i in range(count)])
    run.at(
        1000,
        *[submit(f"bg-{i}", 6, 8, team=team, user=f"r{i}", est_runtime_s=10 * 3600) for i in range(count)],
    )
    start_all(run, 2000)


def test_team_preempted_too_often_is_protected():
    run = Run(team_preempted_max=2, team_preempting_max=100, user_preempting_max=100)
    fill_nodes(run, 3)
    assert preempt_cycle(run, 20 * MIN, "p1", "prod", "a") is not None
    assert not run.events(T.TeamProtected)
    assert preempt_cycle(run, 21 * MIN, "p2", "prod", "b") is not None
    protected = run.events(T.TeamProtected)
    assert [p.team for p in protected] == ["research"]
    assert preempt_cycle(run, 22 * MIN, "p3", "prod", "c") is None
    assert run.job("p3").last_decline == "no_eligible_victims"
    assert run.job_state("bg-2") == "running"


def test_a_user_past_the_preempting_allowance_may_still_displace_only_their_own_jobs():
    run = Run(user_preempting_max=1, user_preempted_max=100, team_preempting_max=100, team_preempted_max=100)
    run.at(0, *[node(f"n{i}") for i in range(3)])
    run.at(
        1000,
        submit("bg-0", 6, 8, team="research", user="r0", est_runtime_s=10 * 3600),
        submit("bg-1", 6, 8, team="research", user="r1", est_runtime_s=10 * 3600),
        submit("mine", 6, 8, team="prod", user="a", est_runtime_s=10 * 3600),
    )
    start_all(run, 2000)
    first = preempt_cycle(run, 20 * MIN, "p1", "prod", "a")
    assert first.victims == ["bg-0"]  # another user's job: the allowance is used up
    second = preempt_cycle(run, 21 * MIN, "p2", "prod", "a")
    assert second.victims == ["mine"]  # bg-1 is as cheap, but only their own job may go
    assert len(run.state.canonical.user_windows["a"].preempting) == 1
    assert preempt_cycle(run, 22 * MIN, "p3", "prod", "a") is None
    assert run.job("p3").last_decline == "user_preempting_limit"
    assert run.job_state("bg-1") == "running"


def test_a_team_displacing_its_own_jobs_is_neither_downgraded_nor_protected():
    run = Run(team_preempting_max=1, team_preempted_max=1, user_preempting_max=100, user_preempted_max=100)
    fill_nodes(run, 3, team="prod")
    for i, minute in enumerate((20, 21, 22)):
        assert preempt_cycle(run, minute * MIN, f"p{i}", "prod", "a") is not None
    assert not run.events(T.TeamDowngraded) and not run.events(T.TeamProtected)
    later = of(run.at(23 * MIN, submit("p9", 1, 8, team="prod", user="a")), T.JobSubmitted)[0]
    assert later.level == 1


def test_a_log_written_before_own_work_went_uncounted_folds_as_it_was_written():
    run = Run(
        team_preempting_max=100, team_preempted_max=100, user_preempting_max=100, user_preempted_max=100
    )
    fill_nodes(run, 2, team="prod")
    for i, minute in enumerate((20, 21)):
        preempt_cycle(run, minute * MIN, f"p{i}", "prod", "a")
    assert "prod" not in run.state.canonical.team_windows
    old_style = new_state(run.state.canonical.policy)
    for record in run.records:  # the field absent, as an older scheduler wrote it
        event = T.decode_event(T.encode(record.event).replace(b',"own_work_counted":false', b""))
        evolve(old_style, event)
    assert len(old_style.canonical.team_windows["prod"].preempting) == 2
    assert len(old_style.canonical.team_windows["prod"].preempted) == 2


def prod_preempted_twice(**params) -> Run:
    """Team prod passes an allowance of two preemptions an hour."""
    run = Run(
        team_preempting_max=2,
        team_preempted_max=100,
        user_preempting_max=100,
        user_preempted_max=100,
        **params,
    )
    fill_nodes(run, 3)
    preempt_cycle(run, 20 * MIN, "p1", "prod", "a")
    preempt_cycle(run, 21 * MIN, "p2", "prod", "b")
    return run


def test_team_preempting_too_often_is_downgraded():
    run = prod_preempted_twice()
    downgraded = run.events(T.TeamDowngraded)
    assert [d.team for d in downgraded] == ["prod"]
    later = of(run.at(22 * MIN, submit("p3", 1, 8, team="prod", user="c")), T.JobSubmitted)[0]
    assert (later.requested_level, later.level) == (1, 2)
    other = of(run.at(22 * MIN, submit("q1", 1, 8, team="other", user="d")), T.JobSubmitted)[0]
    assert other.level == 1


def test_victims_per_preemption_are_capped():
    run = Run(victims_per_preemption_max=2)
    run.at(0, node("a1"))
    run.at(1000, *[submit(f"one-{i}", 6, 2, user=f"u{i}", est_runtime_s=10 * 3600) for i in range(4)])
    start_all(run, 2000)
    events = run.at(HOUR, submit("urgent", 1, 8, team="safety", user="ana"))
    assert not of(events, T.PreemptionPlanned)
    assert of(events, T.PreemptionDeclined)[0].reason == "no_victim_set_within_limits"


def test_guaranteed_share_keeps_a_level_from_being_preempted_below_it():
    run = Run(guaranteed_share=[0, 0, 0, 0, 0, 0, 0.5, 0])
    fill_nodes(run, 2)  # level 6 holds 16 of 16 GPUs; its guarantee is 8
    first = preempt_cycle(run, 20 * MIN, "p1", "prod", "a")
    assert first is not None
    run.at(20 * MIN + 40_000, T.Released(job=first.victims[0]))
    assert preempt_cycle(run, 40 * MIN, "p2", "prod", "b") is None
    assert run.job("p2").last_decline == "no_victim_set_within_limits"


def test_minimal_victim_set_prefers_cheapest_jobs():
    run = Run()
    run.at(0, node("a1"))
    run.at(
        1000,
        submit("cheap", 7, 4, user="u1", est_runtime_s=10 * 3600, ckpt_cost_s=5),
        submit("dear", 6, 4, user="u2", est_runtime_s=10 * 3600, ckpt_cost_s=600),
    )
    start_all(run, 2000)
    events = run.at(HOUR, submit("mid", 2, 4, team="safety", user="ana"))
    assert of(events, T.PreemptionPlanned)[0].victims == ["cheap"]


def test_gpus_of_the_wrong_model_are_never_chosen():
    run = Run()
    run.at(0, node("a1", "A100"), node("h1", "H100"))
    run.at(
        1000,
        submit("on-a", 6, 8, models=["A100"], est_runtime_s=10 * 3600),
        submit("on-h", 6, 8, models=["H100"], user="u2", est_runtime_s=10 * 3600),
    )
    start_all(run, 2000)
    events = run.at(HOUR, submit("wants-h", 1, 8, team="safety", user="ana", models=["H100"]))
    plan = of(events, T.PreemptionPlanned)[0]
    assert plan.victims == ["on-h"]
    assert [s.node for s in plan.placement] == ["h1"]
    free_a = Run()
    free_a.at(0, node("a1", "A100"))
    assert not of(free_a.at(1000, submit("h-only", 3, 1, models=["H100"])), T.JobStartRequested)


def test_job_larger_than_any_node_is_one_gang_across_nodes_or_not_at_all():
    run = Run()
    run.at(0, node("n1"), node("n2"), node("n3"))
    run.at(1000, submit("small", 5, 4, est_runtime_s=10 * 3600))
    start_all(run, 1000)
    big = of(run.at(2000, submit("big", 5, 16, user="u2")), T.JobStartRequested)
    assert len(big) == 1
    assert sum(len(s.gpus) for s in big[0].placement) == 16
    assert sorted(s.node for s in big[0].placement) == ["n2", "n3"]
    check_invariants(run.state)
    too_big = run.at(3000, submit("bigger", 5, 12, user="u3"))
    assert not of(too_big, T.JobStartRequested)
    assert run.job_state("bigger") == "queued"
    assert all(h == "" for h in run.state.canonical.nodes["n1"].holder[4:])


def test_preemptor_cancelled_mid_saga_rolls_back():
    run = two_victims_on_one_node()
    run.at(20 * MIN, submit("urgent", 1, 8, team="safety", user="ana"))
    run.at(20 * MIN + 30_000, T.Released(job="low-1"))
    events = run.at(20 * MIN + 31_000, T.Cancel(job="urgent"))
    assert [r.reason for r in of(events, T.PreemptionRolledBack)] == ["preemptor_cancelled"]
    assert [e.job for e in of(events, T.JobResumeRequested)] == ["low-1"]
    assert run.job_state("urgent") == "cancelled"
    check_invariants(run.state)


def test_lost_node_rolls_back_its_saga_and_requeues_its_jobs():
    run = two_victims_on_one_node()
    run.at(20 * MIN, submit("urgent", 1, 8, team="safety", user="ana"))
    events = run.at(20 * MIN + 5000, T.NodeDown(node="a1"))
    assert [r.reason for r in of(events, T.PreemptionRolledBack)] == ["node_lost"]
    assert sorted(e.job for e in of(events, T.JobRequeued)) == ["low-1", "low-2"]
    assert of(events, T.NodeLost)[0].jobs == ["low-1", "low-2"]
    check_invariants(run.state)
    assert run.state.index.free_by_model.get("A100", 0) == 0


def test_a_gang_across_nodes_never_mixes_gpu_models():
    run = Run()
    run.at(0, node("a1", "A100"), node("h1", "H100"), node("h2", "H100"))
    events = run.at(1000, submit("any-16", 5, 16, models=[]))
    placed = of(events, T.JobStartRequested)
    assert [sorted(s.node for s in p.placement) for p in placed] == [["h1", "h2"]]
    run2 = Run()
    run2.at(0, node("a1", "A100"), node("h1", "H100"))
    assert not of(run2.at(1000, submit("any-16", 5, 16, models=[])), T.JobStartRequested)


def test_gpus_held_for_a_blocked_gang_do_not_count_as_free_for_an_urgent_job():
    """a2's free GPUs are held for the level-0 gang (which, here, may not preempt level 3):
    the level-1 job cannot use them, so its natural wait is the 10-hour job on a1, and it
    preempts there instead of waiting for GPUs that are promised."""
    run = Run(preempts_from_level=[4, 3, 4, 6, 7, 8, 8, 8])
    run.at(0, node("a1"), node("a2"))
    run.at(
        1,
        submit(
            "long", 3, 8, team="ops", user="o", est_runtime_s=10 * 3600, ckpt_cost_s=20, restore_cost_s=20
        ),
        submit("level3", 3, 6, team="ops", user="o", est_runtime_s=600),
    )
    start_all(run, 2)
    run.at(10, submit("gang", 0, 8, team="g", user="g", est_runtime_s=3600))
    assert reserved_nodes(run.state)["a2"][1] == "gang"
    events = run.at(20, submit("urgent", 1, 2, team="u", user="u", est_runtime_s=3600))
    plan = of(events, T.PreemptionPlanned)
    assert [(p.preemptor, p.victims) for p in plan] == [("urgent", ["long"])]
    assert plan[0].placement[0].node == "a1"


def test_a_victim_that_would_requeue_behind_a_deep_queue_costs_more():
    """The requeued victim's wait is estimated from the GPUs queued ahead of it: with a deep
    queue at more urgent levels the same preemption is declined. (Without the urgent wait
    target: its overdue premium pays for a victim's requeue wait, and the urgent job here
    would wait hours; tests/test_core_urgent_wait_target.py.)"""

    def attempt(queued_ahead: int) -> list:
        # The queue ahead may not preempt, by priority nor by reclaiming team q's share.
        run = Run(
            preempts_from_level=[2, 3, 8, 8, 8, 8, 8, 8],
            fair_share_guarantee=False,
            urgent_overdue_factor=1.0,
        )
        run.at(0, node("a1"), node("a2"))
        run.at(
            1,
            submit(
                "victim",
                6,
                8,
                team="ops",
                user="o",
                est_runtime_s=10 * 3600,
                ckpt_cost_s=20,
                restore_cost_s=20,
            ),
            submit("level2", 2, 8, team="ops", user="o", est_runtime_s=3 * 3600),
        )
        start_all(run, 2)
        run.at(
            5,
            *[
                submit(f"ahead-{i}", 2, 8, team="q", user=f"q{i}", est_runtime_s=4 * 3600)
                for i in range(queued_ahead)
            ],
        )
        return run.at(10, submit("urgent", 1, 1, team="u", user="u", est_runtime_s=10 * 3600))

    assert of(attempt(0), T.PreemptionPlanned)
    declined = of(attempt(6), T.PreemptionDeclined)
    assert [d.reason for d in declined if d.job == "urgent"] == ["benefit_below_cost"]


def test_a_job_past_its_estimate_is_expected_to_run_as_long_again_as_it_has_overrun():
    """Runtimes are heavy-tailed: a job that outlived its estimate is not about to end, so
    waiting for it does not look cheap (the Lindy effect), and never looks free."""
    from core.forecast.release import remaining_ms

    run = Run()
    run.at(0, node("a1"))
    run.at(1, submit("long", 6, 8, est_runtime_s=3600))
    run.at(2, started("long"))  # runs from t=2 ms

    def remaining_at(t: int) -> int:
        run.state.canonical.t = t  # the clock decisions read (step sets it to the input's time)
        return remaining_ms(run.state, run.job("long"))

    assert remaining_at(2) == HOUR
    assert remaining_at(2 + HOUR // 2) == HOUR // 2
    assert remaining_at(2 + HOUR + MIN) == HOUR // 10  # just past: a tenth of the estimate
    assert remaining_at(2 + 3 * HOUR) == 2 * HOUR


def _kill_for_urgent(queued_behind: int = 0, **params) -> list:
    """A level-7 job that cannot checkpoint has run 10 hours on a 32-GPU pool where a
    level-0 job holds the rest; a level-1 job would otherwise wait 40 minutes."""
    run = Run(**params)
    run.at(0, node("a1", gpus=2), node("big", gpus=30))
    run.at(
        1,
        submit("no-ckpt", 7, 1, team="x", user="x", est_runtime_s=20 * 3600, ckpt_interval_s=0),
        submit("other", 3, 1, team="y", user="y", est_runtime_s=10 * 3600 + 40 * 60),
        submit("holder", 0, 30, team="z", user="z", est_runtime_s=20 * 3600, preemptible=False),
    )
    start_all(run, 2)
    run.at(3, *[submit(f"behind-{i}", 6, 30, team="w", user=f"w{i}") for i in range(queued_behind)])
    return run.at(10 * HOUR, submit("urgent", 1, 1, team="u", user="u", est_runtime_s=600))


def test_wasted_work_of_a_low_level_victim_is_not_cheap():
    """Killing the level-7 job throws 10 GPU-hours away. Saving the level-1 job 40 minutes
    does not outweigh that at the wasted-work weight floor (1.0); with the floor at 0 the
    level-7 weight (0.25) makes it look cheap."""
    kept = _kill_for_urgent()
    assert not of(kept, T.PreemptionPlanned)
    assert [d.reason for d in of(kept, T.PreemptionDeclined) if d.job == "urgent"] == ["benefit_below_cost"]
    killed = of(_kill_for_urgent(wasted_work_weight_min=0.0), T.PreemptionPlanned)
    assert [p.victims for p in killed] == [["no-ckpt"]]


def test_wasted_work_weighs_more_when_a_deep_queue_waits_for_the_pool():
    """Redoing wasted work delays every queued job: with 8 level-6 jobs of 30 GPUs queued
    (pressure 8 x 30 x 0.5 / 32 = 3.75), the same kill is declined even with no floor."""
    declined = _kill_for_urgent(queued_behind=8, wasted_work_weight_min=0.0)
    assert not of(declined, T.PreemptionPlanned)


def test_a_level_with_no_eligible_victims_does_not_use_up_the_attempts_of_a_tick():
    """Two planning attempts per tick: the level-1 heads need H100s, held by level-1 jobs
    they may not preempt; after the first finds no victim its level-mates are skipped, so
    the level-2 job, which has a level-6 victim on the A100, gets the second attempt."""
    run = Run(preemption_candidates_max=2)
    run.at(0, node("h1", "H100", gpus=2), node("a1", "A100", gpus=1))
    run.at(
        1,
        submit("h-busy-1", 1, 1, team="x", user="x", models=["H100"], est_runtime_s=36000),
        submit("h-busy-2", 1, 1, team="x", user="x", models=["H100"], est_runtime_s=36000),
        submit(
            "a-busy",
            6,
            1,
            team="y",
            user="y",
            models=["A100"],
            est_runtime_s=36000,
            ckpt_cost_s=10,
            restore_cost_s=10,
        ),
    )
    run.at(2, started("h-busy-1"), started("h-busy-2"))
    # a-busy is still starting: no one can preempt it yet.
    run.at(
        10,
        submit("h-wait-1", 1, 1, team="h", user="h1", models=["H100"]),
        submit("h-wait-2", 1, 1, team="h", user="h2", models=["H100"]),
        submit("a-wait", 2, 1, team="a", user="a", models=["A100"], est_runtime_s=600),
    )
    run.at(20, started("a-busy"))
    events = run.at(5 * MIN, tick(5 * MIN))
    assert [(p.preemptor, p.victims) for p in of(events, T.PreemptionPlanned)] == [("a-wait", ["a-busy"])]


def test_an_urgent_job_prefers_the_victim_that_lets_go_sooner():
    """`slow` is a little cheaper to preempt (less restore), but takes 55 s to save; `quick`
    saves in 10 s. The level-0 job's own wait while the victim saves decides it."""
    run = Run()
    run.at(0, node("a1", gpus=1), node("a2", gpus=1))
    run.at(
        1,
        submit("quick", 6, 1, team="x", user="x", est_runtime_s=36000, ckpt_cost_s=10, restore_cost_s=60),
        submit("slow", 6, 1, team="y", user="y", est_runtime_s=36000, ckpt_cost_s=55, restore_cost_s=10),
    )
    start_all(run, 2)
    plan = of(
        run.at(HOUR, submit("urgent", 0, 1, team="u", user="u", est_runtime_s=600)), T.PreemptionPlanned
    )
    assert [p.victims for p in plan] == [["quick"]]


def test_a_team_with_most_of_the_demand_may_preempt_in_proportion_before_it_is_downgraded():
    """Two preemptions an hour per team with an even share of the demand. Besides the
    victims' team, three teams queue one GPU each and `big` queues 48: the same two
    preemptions downgrade `small` (its share is about the mean) but not `big` (3.5x it)."""

    def downgraded_after_two(team: str, queued_by_big: int) -> list[str]:
        run = Run(
            team_preempting_max=2,
            team_preempted_max=100,
            user_preempting_max=100,
            user_preempted_max=100,
            fair_share_guarantee=False,
        )  # tiny teams would reclaim
        fill_nodes(run, 3)
        run.at(
            10 * MIN,
            *[submit(f"big-q{i}", 7, 8, team="big", user=f"q{i}") for i in range(queued_by_big)],
            *[submit(f"tiny-{i}", 7, 1, team=f"tiny{i}", user=f"t{i}") for i in range(3)],
        )
        preempt_cycle(run, 20 * MIN, "p1", team, "a")
        preempt_cycle(run, 21 * MIN, "p2", team, "b")
        return [d.team for d in run.events(T.TeamDowngraded)]

    assert downgraded_after_two("small", queued_by_big=6) == ["small"]
    assert downgraded_after_two("big", queued_by_big=6) == []


def test_a_queue_wait_is_bounded_by_the_pools_pace_not_its_longest_job():
    """Four one-GPU jobs end in 10, 20 and 30 minutes and 100 hours. Five GPUs more than
    are free will not take 100 hours: the pool frees 3 GPUs per 30 minutes at its median."""
    from core.forecast.waits import ReleaseCurve

    run = Run()
    run.at(0, node("a1", gpus=4))
    run.at(
        1, *[submit(f"j{m}", 6, 1, team="x", user=f"u{m}", est_runtime_s=m * 60) for m in (10, 20, 30, 6000)]
    )
    run.at(1, *[started(f"j{m}") for m in (10, 20, 30, 6000)])
    curve = ReleaseCurve(run.state, [run.state.canonical.nodes["a1"]], HOUR)
    assert curve.wait_for(2) == 20 * MIN
    assert curve.wait_for(5) == 50 * MIN


def test_a_tick_decides_with_its_own_time_not_the_last_recorded_event():
    """Nothing was recorded between the victim's start and the tick two hours later: the
    plan must count two hours of lost progress, not the none the last event's time shows,
    and the state's clock must stay where the events left it when a tick records nothing."""
    run = Run()
    run.at(0, node("a1", gpus=1))
    run.at(1, submit("no-ckpt", 7, 1, team="x", user="x", est_runtime_s=20 * 3600, ckpt_interval_s=0))
    run.at(5, submit("urgent", 0, 1, team="u", user="u", est_runtime_s=600))  # victim not running yet
    run.at(20_000, started("no-ckpt"))
    plans = of(run.at(2 * HOUR, tick(2 * HOUR)), T.PreemptionPlanned)
    assert [p.victims for p in plans] == [["no-ckpt"]]
    assert f"victims lose {2 * HOUR - 20_000} ms of progress" in plans[0].reason

    idle = Run()
    idle.at(0, node("a1", gpus=1))
    assert idle.at(HOUR, tick(HOUR)) == []
    assert idle.state.canonical.t == 0


def test_an_urgent_preemptor_lets_a_victim_with_little_unsaved_work_go_without_saving():
    """Three minutes of unsaved work on a victim whose save takes a minute: a level-0 gang on all eight GPUs would rather the
    victim let go at once (its wait weighs more than the lost minutes), a level-4 one would
    rather wait for the save."""

    def notices_for(level: int, gpus: int) -> list[T.VictimNotified]:
        run = Run(preempts_from_level=[1, 2, 4, 6, 7, 7, 7, 8])
        run.at(0, node("a1"))
        run.at(
            1,
            submit(
                "victim",
                7,
                8,
                team="research",
                user="r",
                est_runtime_s=10 * 3600,
                ckpt_cost_s=60,
                restore_cost_s=60,
            ),
        )
        start_all(run, 2)
        run.at(HOUR - 3 * MIN, T.CheckpointSaved(job="victim", step=1, digest="sha256:v1", bytes=1))
        return of(
            run.at(HOUR, submit("urgent", level, gpus, team="ops", user="o", est_runtime_s=10 * 3600)),
            T.VictimNotified,
        )

    assert [n.checkpoint_needed for n in notices_for(0, 8)] == [False]
    assert [n.checkpoint_needed for n in notices_for(4, 8)] == [True]


def test_a_victim_is_charged_at_most_the_wait_the_preemptor_saves_on_the_gpus_it_takes():
    """The 1-GPU victim would requeue behind a deep level-2 queue, but the urgent job only
    saves 30 minutes: the GPU-time it takes moves earlier, it does not grow, so the
    victim's displacement is priced at those 30 minutes, not at the queue's depth (which
    would cost more than the urgent job's wait is worth)."""
    # The queue ahead may not preempt; no overhead term, so only displacement is priced.
    run = Run(preempts_from_level=[2, 3, 8, 8, 8, 8, 8, 8], preemption_overhead_s=0.0)
    run.at(0, node("a1"))
    run.at(
        1,
        submit(
            "victim", 6, 1, team="ops", user="o", est_runtime_s=10 * 3600, ckpt_cost_s=20, restore_cost_s=20
        ),
        submit("level2", 2, 7, team="ops", user="o", est_runtime_s=30 * 60),
    )
    start_all(run, 2)
    run.at(5, *[submit(f"ahead-{i}", 2, 8, team="q", user=f"q{i}", est_runtime_s=4 * 3600) for i in range(6)])
    events = run.at(10, submit("urgent", 1, 1, team="u", user="u", est_runtime_s=10 * 3600))
    plan = of(events, T.PreemptionPlanned)
    assert [p.victims for p in plan] == [["victim"]]
    weight = run.state.canonical.policy.level_weight
    assert plan[0].cost <= weight[6] * 30 * 60  # it has no work to lose yet
    assert plan[0].benefit < weight[6] * 10 * 3600  # what the queue's depth would have cost


def test_a_burst_of_urgent_jobs_expects_the_later_ones_to_wait_for_the_earlier():
    from core.forecast.waits import natural_wait_ms

    run = Run(preempts_from_level=[8] * 8)  # nobody preempts: only the estimate is looked at
    run.at(0, node("a1"))
    run.at(
        1,
        submit("short", 6, 1, est_runtime_s=120),
        *[submit(f"long-{i}", 6, 1, user=f"u{i}", est_runtime_s=10 * 3600) for i in range(7)],
    )
    start_all(run, 2)
    run.at(10, submit("first", 1, 1, team="ops", user="o"), submit("second", 1, 1, team="ops", user="o"))
    nodes = [run.state.canonical.nodes["a1"]]
    first = natural_wait_ms(run.state, run.job("first"), nodes)
    second = natural_wait_ms(run.state, run.job("second"), nodes)
    assert first <= 2 * MIN
    assert second > HOUR  # the short job's GPU goes to the first; the second waits for a long one


def test_preemptions_by_a_teams_mid_level_jobs_do_not_downgrade_its_urgent_jobs():
    run = Run(
        team_preempting_max=2,
        team_preempted_max=100,
        user_preempting_max=100,
        user_preempted_max=100,
        preempts_from_level=[1, 2, 4, 5, 7, 8, 8, 8],
        fair_share_guarantee=False,
    )  # the third preemption would take ops below its share
    fill_nodes(run, 3)  # level-6 jobs
    for i, t in enumerate((20 * MIN, 21 * MIN, 22 * MIN)):
        plans = of(
            run.at(t, submit(f"mid-{i}", 3, 8, team="prod", user=f"m{i}", est_runtime_s=600)),
            T.PreemptionPlanned,
        )
        assert plans, f"mid-{i} should preempt"
    assert not run.events(T.TeamDowngraded)
    urgent = of(run.at(23 * MIN, submit("urgent", 1, 8, team="prod", user="c")), T.JobSubmitted)[0]
    assert urgent.level == 1


def test_the_time_victims_take_to_reach_a_safe_point_is_learned():
    from core.forecast.waits import safe_point_ms

    run = Run(
        team_preempting_max=100, team_preempted_max=100, user_preempting_max=100, user_preempted_max=100
    )
    fill_nodes(run, 4)
    policy = run.state.canonical.policy
    for i in range(3):
        t = (20 + i) * MIN
        assert safe_point_ms(run.state, policy) == policy.safe_point_ms  # not yet enough victims
        plan = preempt_cycle(run, t, f"p{i}", "prod", f"a{i}")
        run.at(t + 2000 + 1000 * i, T.SafePoint(job=plan.victims[0]))
    assert safe_point_ms(run.state, policy) == 3000  # the mean of 2, 3 and 4 seconds


def test_a_downgrade_lasts_until_the_teams_preemption_quota_recovers():
    """prod preempted at 20 and 21 minutes with an allowance of two an hour: it is back
    under the allowance when the first leaves the window, an hour later. Until then its
    urgent jobs enter a level lower, whatever it holds; a job queued downgraded gets its
    level back then, so its wait is bounded by the downgrade."""
    run = prod_preempted_twice()
    until = run.events(T.TeamDowngraded)[0].until_t
    assert until == 20 * MIN + run.state.canonical.policy.fairness_window_ms
    run.at(23 * MIN, T.Cancel(job="p1"), T.Cancel(job="p2"))
    # p4 asks for a model whose only node is down: it stays queued, downgraded, until the
    # quota recovers (a model no node ever had would be refused at submit).
    run.at(24 * MIN, node("h9", "H100"), T.NodeDown(node="h9"))
    during = of(run.at(24 * MIN, submit("p4", 1, 8, team="prod", user="d", models=["H100"])), T.JobSubmitted)[
        0
    ]
    assert (during.requested_level, during.level) == (1, 2)
    assert not of(run.at(until - 1000, tick(until - 1000)), T.JobLevelRestored)
    restored = of(run.at(until, tick(until)), T.JobLevelRestored)
    assert [(e.job, e.level) for e in restored] == [("p4", 1)]
    assert run.job("p4").level == 1 and run.job("p4").eff_level <= 1
    after = of(run.at(until + 1000, submit("p5", 1, 8, team="prod", user="e")), T.JobSubmitted)[0]
    assert after.level == 1


def test_the_deprecated_team_downgrade_ms_is_still_accepted_and_changes_no_decision():
    """Older logs and policy files set `team_downgrade_ms` (a fixed downgrade time, before a
    downgrade lasted until the quota recovers): a set_policy with it is still accepted, and
    the same story decides exactly the same with it as without."""
    accepted = Run().at(MIN, T.SetPolicy(params={"team_downgrade_ms": 60_000}, by="ops"))
    assert of(accepted, T.PolicyChanged) and not of(accepted, T.InputRejected)
    plain, old = prod_preempted_twice(), prod_preempted_twice(team_downgrade_ms=60_000)
    # After the first record, which names each run's policy (and so the deprecated parameter):
    assert old.events(T.TeamDowngraded) and old.events()[1:] == plain.events()[1:]
    assert deprecation_notes({"team_downgrade_ms": 1, "fairness_window_ms": 2}) == [
        "policy parameter 'team_downgrade_ms' is deprecated, no effect: a team's downgrade lasts until"
        " its preemption quota recovers (team_preempting_max in fairness_window_ms)"
    ]


def test_a_downgrade_ends_as_soon_as_the_team_is_back_within_its_allowance():
    """The allowance follows the team's share of the demand, and the downgrade is re-read on
    every pass, not fixed at submit: once prod asks for most of the pool its two preemptions
    in the window are within its allowance, so the downgrade announced until the first
    leaves the window ends at once; the queued downgraded job gets its level back and the
    next urgent job enters at its own."""
    run = prod_preempted_twice()
    until = run.events(T.TeamDowngraded)[0].until_t
    run.at(24 * MIN, node("h9", "H100"), T.NodeDown(node="h9"))
    during = of(run.at(24 * MIN, submit("p4", 1, 8, team="prod", user="d", models=["H100"])), T.JobSubmitted)[
        0
    ]
    assert (during.requested_level, during.level) == (1, 2)
    more = [submit(f"big-{i}", 6, 8, team="prod", user="e", est_runtime_s=3600) for i in range(10)]
    restored = of(run.at(25 * MIN, *more), T.JobLevelRestored)
    assert 25 * MIN < until
    assert [(e.job, e.level) for e in restored] == [("p4", 1)]
    prod = [row for row in share_rows(run.state) if row["team"] == "prod"][0]
    assert prod["downgraded_for_s"] is None  # what `xirang shares` shows agrees
    after = of(run.at(26 * MIN, submit("p5", 1, 8, team="prod", user="f")), T.JobSubmitted)[0]
    assert after.level == 1


def test_an_operator_may_bound_the_wait_of_a_downgraded_urgent_job():
    """With `downgraded_wait_max_ms` (an opt-in; off, a downgraded job waits for its team's
    quota), a job queued downgraded gets its level back once it has waited that long, while
    the team stays downgraded for the jobs it submits next."""
    run = prod_preempted_twice(downgraded_wait_max_ms=5 * MIN)
    until = run.events(T.TeamDowngraded)[0].until_t
    run.at(23 * MIN, T.Cancel(job="p1"), T.Cancel(job="p2"))
    run.at(24 * MIN, node("h9", "H100"), T.NodeDown(node="h9"))
    during = of(run.at(24 * MIN, submit("p4", 1, 8, team="prod", user="d", models=["H100"])), T.JobSubmitted)[
        0
    ]
    assert (during.requested_level, during.level) == (1, 2)
    assert not of(run.at(29 * MIN - 1000, tick(29 * MIN - 1000)), T.JobLevelRestored)
    restored = of(run.at(29 * MIN, tick(29 * MIN)), T.JobLevelRestored)
    assert [(e.job, e.level, e.waited_ms) for e in restored] == [("p4", 1, 5 * MIN)]
    later = of(run.at(30 * MIN, submit("p5", 1, 8, team="prod", user="e")), T.JobSubmitted)[0]
    assert 30 * MIN < until and later.level == 2  # the team is still downgraded
