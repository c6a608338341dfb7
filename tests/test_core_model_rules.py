"""The priority model as xirang promises it (README, "the model's rules"), one scenario per rule: only a more
urgent level preempts; levels are served in order, each by its own queue policy; team fair
share works inside levels 3-5; guaranteed shares in whole GPUs that never strand an
emergency; preemption depth defined, limited and recorded; a downgrade that really lowers
the level. The cross-pool team guarantee with reclaim is an opt-in."""

import pytest

from core import types as T
from core.passes.placement import reserved_nodes

from scenario import HOUR, MIN, Run, check_invariants, node, of, start_all, submit, tick


def release_all(run: Run, t: int) -> list[T.Event]:
    """Every notified victim reaches its safe point, saves if asked, and lets go."""
    events: list[T.Event] = []
    notices = {e.job: e for e in run.events(T.VictimNotified)}
    for job_id in sorted(run.state.canonical.jobs):
        if run.state.canonical.jobs[job_id].state != "preempting":
            continue
        inputs = [T.SafePoint(job=job_id)]
        if notices[job_id].checkpoint_needed:
            inputs.append(T.CheckpointSaved(job=job_id, step=1, digest=f"sha256:{job_id}", bytes=1))
        inputs.append(T.Released(job=job_id))
        events += run.at(t, *inputs)
    return events


def fresh_checkpoint(run: Run, t: int, *jobs: str) -> None:
    run.at(t, *(T.CheckpointSaved(job=j, step=1, digest=f"sha256:{j}-{t}", bytes=1) for j in jobs))


def team_holds_the_pool(level: int, **params) -> Run:
    """Team `big` holds both nodes at `level` with long jobs that checkpoint often."""
    run = Run(**params)
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        submit("big-1", level, 8, team="big", user="b1", est_runtime_s=50 * 3600),
        submit("big-2", level, 8, team="big", user="b2", est_runtime_s=50 * 3600),
    )
    start_all(run, 2000)
    fresh_checkpoint(run, 10 * MIN, "big-1", "big-2")
    return run


# ---------------------------------------------------------------- only a more urgent level preempts


def test_same_level_never_preempts_another_team_whatever_its_share():
    run = team_holds_the_pool(4)
    events = run.at(10 * MIN + 1000, submit("small-1", 4, 8, team="small", user="s1", est_runtime_s=3600))
    events += run.at(HOUR, tick(HOUR))
    assert not of(events, T.PreemptionPlanned)
    assert run.job_state("big-1") == "running" and run.job_state("big-2") == "running"


def test_a_less_urgent_level_never_preempts_a_more_urgent_one_whatever_the_shares():
    run = team_holds_the_pool(3)
    events = run.at(10 * MIN + 1000, submit("small-1", 7, 1, team="small", user="s1", est_runtime_s=600))
    events += run.at(HOUR, tick(HOUR))
    assert not of(events, T.PreemptionPlanned)


def test_opt_in_reclaim_takes_back_a_teams_share_from_a_borrowing_team():
    run = team_holds_the_pool(4, fair_share_guarantee=True)
    events = run.at(10 * MIN + 1000, submit("small-1", 4, 8, team="small", user="s1", est_runtime_s=3600))
    events += run.at(11 * MIN, tick(11 * MIN))
    plans = of(events, T.PreemptionPlanned)
    assert len(plans) == 1 and plans[0].reclaim and plans[0].preemptor == "small-1"
    assert plans[0].victims[0] in ("big-1", "big-2")
    check_invariants(run.state)


# ---------------------------------------------------------------- each level by its own queue policy


def test_levels_0_to_2_serve_first_come_first_served_whatever_each_team_holds():
    """Team rich holds 6 of 8 GPUs; its level-2 job came first, so it gets the 2 free GPUs
    before team poor's, though poor holds nothing (no cross-pool share reorders a level)."""
    run = Run()
    run.at(0, node("n1"))
    run.at(
        1000,
        submit("rich-run", 5, 6, team="rich", user="r", est_runtime_s=10 * 3600, preemptible=False),
        submit("blocker", 5, 2, team="rich", user="r", est_runtime_s=600, preemptible=False),
    )
    start_all(run, 2000)
    run.at(3000, submit("rich-2", 2, 2, team="rich", user="r", est_runtime_s=3600))
    run.at(3500, submit("poor-2", 2, 2, team="poor", user="p", est_runtime_s=3600))
    events = run.at(4000, T.Finished(job="blocker", ok=True))
    assert [e.job for e in of(events, T.JobStartRequested)] == ["rich-2"]


def test_levels_are_served_in_order_before_any_team_share():
    """A level-3 job of a team holding most of the pool starts before a level-5 job of a
    team holding nothing."""
    run = Run()
    run.at(0, node("n1"))
    run.at(
        1000,
        submit("rich-run", 6, 6, team="rich", user="r", est_runtime_s=10 * 3600, preemptible=False),
        submit("blocker", 6, 2, team="rich", user="r", est_runtime_s=600, preemptible=False),
    )
    start_all(run, 2000)
    run.at(
        3000,
        submit("poor-5", 5, 2, team="poor", user="p", est_runtime_s=3600),
        submit("rich-3", 3, 2, team="rich", user="r", est_runtime_s=3600),
    )
    events = run.at(4000, T.Finished(job="blocker", ok=True))
    assert [e.job for e in of(events, T.JobStartRequested)] == ["rich-3"]


def test_levels_6_and_7_take_turns_over_teams_whatever_their_quota():
    run = Run(team_quota={"a": 3.0, "b": 1.0})
    run.at(0, node("n1"))
    run.at(
        1000,
        *[
            submit(f"{team}-{i}", 6, 1, team=team, user=team, t=1000 + i)
            for i in range(8)
            for team in ("a", "b")
        ],
    )
    started_jobs = [e.job for e in run.events(T.JobStartRequested)]
    assert sum(j.startswith("a-") for j in started_jobs) == 4
    assert sum(j.startswith("b-") for j in started_jobs) == 4


def test_a_fair_share_level_preempts_for_the_team_furthest_below_its_quota_first():
    """Team a holds a node at level 4 and queues an older 8-GPU job; team b, holding nothing
    at level 4, queues one later. Both are declined while the level-7 victim has 39 h of
    unsaved work. Once it saves, the one attempt a pass goes to b's job: the GPUs the level
    takes by preemption are its next GPUs too, and fair share says who gets them, not the
    submit order."""
    run = Run(preemption_candidates_max=1)
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        submit("a-run", 4, 8, team="a", user="a", est_runtime_s=45 * 3600, preemptible=False),
        submit("batch", 7, 8, team="c", user="c", est_runtime_s=50 * 3600, ckpt_interval_s=0),
    )
    start_all(run, 2000)
    declined = run.at(39 * HOUR, submit("a-old", 4, 8, team="a", user="a2", est_runtime_s=3600))
    declined += run.at(39 * HOUR + MIN, submit("b-new", 4, 8, team="b", user="b", est_runtime_s=3600))
    assert [e.reason for e in of(declined, T.PreemptionDeclined)] == ["benefit_below_cost"] * 2
    fresh_checkpoint(run, 40 * HOUR, "batch")
    run.at(40 * HOUR + 2 * MIN, tick(40 * HOUR + 2 * MIN))
    assert [p.preemptor for p in run.events(T.PreemptionPlanned)] == ["b-new"]


def test_fair_share_inside_levels_3_to_5_counts_only_what_teams_hold_at_that_level():
    """Team a holds 4 GPUs at level 6, team b 2 at level 4. Two GPUs free up: at level 4, a
    holds nothing and b holds 2, so a's level-4 job goes first (across the pool a holds more)."""
    run = Run()
    run.at(0, node("n1"))
    run.at(
        1000,
        submit("a-low", 6, 4, team="a", user="a", est_runtime_s=10 * 3600, preemptible=False),
        submit("b-mid", 4, 2, team="b", user="b", est_runtime_s=10 * 3600, preemptible=False),
        submit("blocker", 4, 2, team="c", user="c", est_runtime_s=600, preemptible=False),
    )
    start_all(run, 2000)
    run.at(
        3000,
        submit("b-4", 4, 2, team="b", user="b", est_runtime_s=3600),
        submit("a-4", 4, 2, team="a", user="a", est_runtime_s=3600),
    )
    events = run.at(4000, T.Finished(job="blocker", ok=True))
    assert [e.job for e in of(events, T.JobStartRequested)] == ["a-4"]


# ---------------------------------------------------------------- guaranteed shares


def _one_gpu_of_level_3_on_a_full_pool(gpus_per_node: int = 8, nodes: int = 2, **params) -> Run:
    """A pool of non-preemptible work, save one level-3 one-GPU job with a fresh checkpoint."""
    run = Run(**params)
    run.at(0, *(node(f"n{i}", gpus=gpus_per_node) for i in range(nodes)))
    run.at(1000, submit("lvl3", 3, 1, team="batch", user="b", est_runtime_s=20 * 3600))
    start_all(run, 1500)
    fillers = [
        submit(
            f"fill-{i}",
            5,
            gpus_per_node - 1 if i == 0 else gpus_per_node,
            team="infra",
            user="i",
            est_runtime_s=20 * 3600,
            preemptible=False,
        )
        for i in range(nodes)
    ]
    run.at(2000, *fillers)
    start_all(run, 3000)
    fresh_checkpoint(run, 10 * MIN, "lvl3")
    return run


def test_a_guarantee_under_one_gpu_does_not_strand_a_level_0_fix():
    """16 GPUs: level 3's 5% is 0.8 GPU, no whole GPU: the level-0 fix plans within a minute."""
    run = _one_gpu_of_level_3_on_a_full_pool()
    submitted_t = 10 * MIN + 1000
    run.at(submitted_t, submit("fix", 0, 1, team="sre", user="oncall", est_runtime_s=1800))
    run.at(submitted_t + 30_000, tick(submitted_t + 30_000))
    plans = run.events(T.PreemptionPlanned)
    assert plans and plans[0].preemptor == "fix" and plans[0].victims == ["lvl3"]
    assert plans[0].t - submitted_t <= MIN


def test_a_guaranteed_share_of_whole_gpus_shields_its_level_from_less_urgent_gangs():
    """64 GPUs: level 3 keeps 5% = 3 whole GPUs; it holds 3, so a level-1 job may not take them."""
    run = Run()
    run.at(0, *(node(f"n{i}") for i in range(8)))
    run.at(1000, submit("lvl3", 3, 3, team="batch", user="b", est_runtime_s=20 * 3600))
    start_all(run, 1500)
    run.at(
        2000,
        submit("fill-0", 5, 5, team="infra", user="i", est_runtime_s=20 * 3600, preemptible=False),
        *[
            submit(f"fill-{i}", 5, 8, team="infra", user="i", est_runtime_s=20 * 3600, preemptible=False)
            for i in range(1, 8)
        ],
    )
    start_all(run, 3000)
    fresh_checkpoint(run, 10 * MIN, "lvl3")
    events = run.at(10 * MIN + 1000, submit("urgent", 1, 3, team="sre", user="o", est_runtime_s=1800))
    assert not of(events, T.PreemptionPlanned)
    assert [e.reason for e in of(events, T.PreemptionDeclined)] == ["no_victim_set_within_limits"]


def test_a_level_0_gang_is_never_kept_waiting_by_a_guarantee_smaller_than_it():
    """The same pool; a level-0 job of 4 GPUs needs the level's 3 guaranteed GPUs and the one
    free: a 3-GPU guarantee is smaller than its gang, so it does not keep it waiting."""
    run = Run()
    run.at(0, *(node(f"n{i}") for i in range(8)))
    run.at(1000, submit("lvl3", 3, 3, team="batch", user="b", est_runtime_s=20 * 3600))
    start_all(run, 1500)
    run.at(
        2000,
        submit("fill-0", 5, 4, team="infra", user="i", est_runtime_s=20 * 3600, preemptible=False),
        *[
            submit(f"fill-{i}", 5, 8, team="infra", user="i", est_runtime_s=20 * 3600, preemptible=False)
            for i in range(1, 8)
        ],
    )
    start_all(run, 3000)
    fresh_checkpoint(run, 10 * MIN, "lvl3")
    events = run.at(10 * MIN + 1000, submit("fix", 0, 4, team="sre", user="o", est_runtime_s=1800))
    plans = of(events, T.PreemptionPlanned)
    assert plans and plans[0].victims == ["lvl3"]


# ---------------------------------------------------------------- preemption depth


def _chain(**params) -> Run:
    """Three nodes of three models; b's level-2 job can run on X or Y, c's level-4 job on Y
    or Z, d's level-7 job on Z. A level-0 job that needs X sets off a cascade. (No level
    keeps a guaranteed share here: each level's only job is a victim.)"""
    run = Run(guaranteed_share=[0.0] * 8, **params)
    run.at(0, node("nx", "X"), node("ny", "Y"), node("nz", "Z"))
    run.at(1000, submit("b-2", 2, 8, team="b", user="b", models=["X", "Y"], est_runtime_s=50 * 3600))
    start_all(run, 1500)
    run.at(2000, submit("c-4", 4, 8, team="c", user="c", models=["Y", "Z"], est_runtime_s=50 * 3600))
    start_all(run, 2500)
    run.at(3000, submit("d-7", 7, 8, team="d", user="d", models=["Z"], est_runtime_s=50 * 3600))
    start_all(run, 3500)
    fresh_checkpoint(run, 10 * MIN, "b-2", "c-4", "d-7")
    return run


def _follow_the_cascade(run: Run) -> list[T.PreemptionPlanned]:
    t = 10 * MIN + 1000
    run.at(t, submit("a-0", 0, 8, team="a", user="a", models=["X"], est_runtime_s=3600))
    for _ in range(4):
        t += 20_000
        release_all(run, t)
        start_all(run, t + 1000)
        fresh_checkpoint(run, t + 2000, *[j for j in ("c-4", "d-7") if run.job_state(j) == "running"])
        t += 60_000
        run.at(t, tick(t))
    return run.events(T.PreemptionPlanned)


def test_preemption_depth_is_recorded_on_every_plan():
    plans = _follow_the_cascade(_chain(preemption_depth_max=3))
    assert [(p.preemptor, p.victims) for p in plans] == [("a-0", ["b-2"]), ("b-2", ["c-4"]), ("c-4", ["d-7"])]
    assert [p.depth for p in plans] == [1, 2, 3]
    assert [p.levels_down for p in plans] == [2, 2, 3]


def test_preemption_depth_is_limited_so_one_urgent_job_sets_off_no_long_cascade():
    run = _chain(preemption_depth_max=2)
    plans = _follow_the_cascade(run)
    assert [p.preemptor for p in plans] == ["a-0", "b-2"]
    assert "preemption_depth_limit" in [e.reason for e in run.events(T.PreemptionDeclined) if e.job == "c-4"]


def test_a_teams_depth_limit_overrides_the_default():
    run = _chain(preemption_depth_max=3, team_preemption_depth_max={"b": 1})
    plans = _follow_the_cascade(run)
    assert [p.preemptor for p in plans] == ["a-0"]
    assert "preemption_depth_limit" in [e.reason for e in run.events(T.PreemptionDeclined) if e.job == "b-2"]


def test_how_many_levels_down_a_teams_jobs_reach_is_limited():
    """Team a may reach at most 1 level down: its level-0 job may not take b's level-2 job."""
    run = _chain(team_preemption_levels_down_max={"a": 1})
    events = run.at(
        10 * MIN + 1000, submit("a-0", 0, 8, team="a", user="a", models=["X"], est_runtime_s=3600)
    )
    assert not of(events, T.PreemptionPlanned)


# ---------------------------------------------------------------- downgrade


def test_a_downgrade_really_lowers_the_level_until_the_preemption_quota_recovers():
    run = Run(team_preempting_max=1)
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        submit("batch-1", 6, 8, team="batch", user="b", est_runtime_s=50 * 3600),
        submit("batch-2", 6, 8, team="batch", user="b", est_runtime_s=50 * 3600),
    )
    start_all(run, 2000)
    fresh_checkpoint(run, 10 * MIN, "batch-1", "batch-2")
    events = run.at(10 * MIN + 1000, submit("ops-1", 0, 8, team="ops", user="o", est_runtime_s=3600))
    assert of(events, T.PreemptionPlanned)
    downgrades = run.events(T.TeamDowngraded)
    assert [d.team for d in downgrades] == ["ops"]
    # The quota recovers when the preemption leaves the fairness window.
    assert downgrades[0].until_t == 10 * MIN + 1000 + run.state.canonical.policy.fairness_window_ms
    later = run.at(20 * MIN, submit("ops-2", 0, 8, team="ops", user="o", est_runtime_s=3600))
    submitted = of(later, T.JobSubmitted)[0]
    assert submitted.requested_level == 0 and submitted.level == 1
    assert run.job("ops-2").level == 1


# ---------------------------------------------------------------- recovery, compensation, notices


def _victim_preempted(run: Run, t: int, preemptor: str, lose_ms: int) -> None:
    """`victim` (8 GPUs, never checkpoints) is preempted by a new level-1 job at t after
    `lose_ms` of run since its last start, and released at once."""
    plans = of(
        run.at(t, submit(preemptor, 1, 8, team="safety", user=preemptor, est_runtime_s=600)),
        T.PreemptionPlanned,
    )
    assert plans, f"{preemptor} did not preempt"
    run.at(t + 20_000, T.Released(job="victim"))
    start_all(run, t + 30_000)


@pytest.mark.parametrize("threshold, exceeded", [(2, False), (1, True)])
def test_compensation_pays_for_all_progress_lost_once_past_the_threshold(threshold, exceeded):
    """Two preemptions lose 1 h and then 2 h of 8-GPU work: the second is the first
    compensated (the count reaches a threshold of 2, or exceeds one of 1, as the model words
    it and the default is), and the grant covers both losses, not only the second; the
    quota bonus lasts `compensation_quota_ms`, for the job's own team and user."""
    run = Run(
        compensation_after_preemptions=threshold,
        compensation_when_exceeded=exceeded,
        min_run_after_restart_ms=0,
        restart_protect_max_ms=0,
    )
    run.at(0, node("a1"))
    run.at(
        1000, submit("victim", 6, 8, team="search", user="li", est_runtime_s=100 * 3600, ckpt_interval_s=0)
    )
    start_all(run, 1000)
    _victim_preempted(run, HOUR + 1000, "p1", HOUR)
    run.at(HOUR + 20 * MIN, T.Finished(job="p1", ok=True))
    start_all(run, HOUR + 21 * MIN)
    _victim_preempted(run, 3 * HOUR + 21 * MIN, "p2", 2 * HOUR)
    quota = [g for g in run.events(T.CompensationGranted) if g.kind == "quota_gpu_hours"]
    assert len(quota) == 1 and quota[0].user == "li" and quota[0].team == "search"
    lost = [e.lost_progress_ms for e in run.events(T.JobRequeued)]
    assert quota[0].lost_progress_ms == sum(lost) and sum(lost) > 2.9 * HOUR
    assert quota[0].amount >= 8 * sum(lost) / HOUR  # GPU-hours of both losses
    assert quota[0].until_t == quota[0].t + run.state.canonical.policy.compensation_quota_ms
    from core.rules.shares import team_quota

    assert team_quota(run.state, "search") > 1.0
    run.state.canonical.t = quota[0].until_t + 1  # read at a later time: the bonus has lapsed
    assert team_quota(run.state, "search") == 1.0


def test_the_recovery_boost_grows_with_the_wait_the_job_has_borne():
    run = Run(requeue_boost_per_preemption=1, requeue_boost_wait_ms=HOUR, requeue_boost_max=5)
    run.at(0, node("a1"))
    run.at(1000, submit("blocker", 6, 8, team="x", user="x", est_runtime_s=3 * HOUR, preemptible=False))
    start_all(run, 1000)
    run.at(2000, submit("victim", 6, 8, team="search", user="li", est_runtime_s=100 * 3600))
    run.at(3 * HOUR, T.Finished(job="blocker", ok=True))
    start_all(run, 3 * HOUR + 1000)  # victim waited about 3 h
    _victim_preempted(run, 4 * HOUR, "p1", HOUR)
    assert run.events(T.JobRequeued)[-1].boost == 1 + 2  # one preemption, 3 h borne (2 ... 3)


def test_a_victim_resumed_after_a_rollback_does_not_count_its_run_as_queue_wait():
    run = Run()
    run.at(0, node("a1"))
    run.at(
        1000,
        submit("v1", 6, 4, team="s", user="s", est_runtime_s=20 * 3600),
        submit("v2", 6, 4, team="s", user="s", est_runtime_s=20 * 3600),
    )
    start_all(run, 2000)
    plan = of(run.at(5 * HOUR, submit("urgent", 1, 8, team="o", user="o")), T.PreemptionPlanned)[0]
    run.at(
        5 * HOUR + 20_000,
        T.SafePoint(job="v1"),
        T.CheckpointSaved(job="v1", step=1, digest="sha256:v1", bytes=1),
        T.Released(job="v1"),
    )
    run.at(plan.deadline_t + 1, tick(plan.deadline_t + 1))  # v2 never lets go: rolled back
    assert run.events(T.PreemptionRolledBack)
    resumed = run.at(plan.deadline_t + 5000, T.Started(job="v1"))
    waited = [e.waited_ms for e in of(resumed, T.JobRunning)]
    assert waited and waited[0] <= 5000 + (plan.deadline_t + 1 - plan.deadline_t)


def test_a_notice_says_why_for_whom_which_gpus_and_by_when():
    run = team_holds_the_pool(6)
    events = run.at(10 * MIN + 1000, submit("fix", 0, 8, team="sre", user="o", est_runtime_s=600))
    notices = of(events, T.VictimNotified)
    assert len(notices) == 1
    notice = notices[0]
    assert notice.preemptor == "fix" and notice.preemptor_level == 0 and "level-0" in notice.reason
    assert notice.gpus == run.job(notice.job).placement and notice.deadline_t > notice.t


def test_the_preemption_overhead_term_is_priced_per_victim():
    costs = []
    for overhead_s in (0.0, 600.0):
        run = team_holds_the_pool(6, preemption_overhead_s=overhead_s)
        plan = of(
            run.at(10 * MIN + 1000, submit("fix", 0, 8, team="sre", user="o", est_runtime_s=600)),
            T.PreemptionPlanned,
        )[0]
        costs.append(plan.cost)
    assert costs[1] - costs[0] >= 8 * 600 * run.state.canonical.policy.wasted_work_weight_min


def test_an_urgent_preemptor_does_not_wait_past_its_bound_for_a_checkpoint_under_way():
    """The victim began a 10-minute save just now: a level-1 job (30 s bound) has it let go
    from its last checkpoint rather than wait out the save."""
    run = team_holds_the_pool(6)
    run.at(10 * MIN + 500, T.CheckpointStarted(job="big-1"), T.CheckpointStarted(job="big-2"))
    run.state.canonical.jobs["big-1"].ckpt_cost_ms = run.state.canonical.jobs["big-2"].ckpt_cost_ms = 10 * MIN
    events = run.at(10 * MIN + 1000, submit("fix", 1, 8, team="sre", user="o", est_runtime_s=600))
    plan = of(events, T.PreemptionPlanned)[0]
    assert plan.deadline_t - plan.t < 10 * MIN


def test_every_urgent_job_is_tried_on_every_pass_whatever_blocks_ahead():
    """Six old level-1 gangs are declined every tick (their only victim ends within minutes
    and never saved its work); with two attempts a pass they would use up every attempt. A
    later level-1 job, declined at submit while its victim had 40 h unsaved, plans on the
    first tick after that victim saves a checkpoint."""
    run = Run(preemption_candidates_max=2)
    run.at(0, node("h1", "H100"), node("a1", "A100"))
    run.at(
        1000,
        submit(
            "h-low",
            6,
            8,
            team="b",
            user="b",
            models=["H100"],
            est_runtime_s=40 * 3600 + 600,
            ckpt_interval_s=0,
        ),
        submit(
            "batch", 6, 8, team="b", user="b2", models=["A100"], est_runtime_s=50 * 3600, ckpt_interval_s=0
        ),
    )
    start_all(run, 2000)
    run.at(
        39 * HOUR,
        *[
            submit(f"old-{i}", 1, 8, team="o", user=f"o{i}", models=["H100"], est_runtime_s=600)
            for i in range(6)
        ],
    )
    late = run.at(40 * HOUR, submit("late", 1, 8, team="l", user="l", models=["A100"], est_runtime_s=600))
    assert [e.reason for e in of(late, T.PreemptionDeclined)] == ["benefit_below_cost"]
    fresh_checkpoint(run, 40 * HOUR + MIN, "batch")
    run.at(40 * HOUR + 2 * MIN, tick(40 * HOUR + 2 * MIN))
    assert [p.preemptor for p in run.events(T.PreemptionPlanned)] == ["late"]


def test_a_victims_safe_point_interval_sets_how_long_the_preemptor_waits_for_it():
    """Two identical victims but one reaches a safe point every 20 min: an urgent job takes
    the one that lets go in seconds, and its plan is ready sooner."""
    run = Run()
    run.at(0, node("n1", gpus=4), node("n2", gpus=4))
    run.at(
        1000,
        submit("slow", 6, 4, team="b", user="b", est_runtime_s=50 * 3600, safe_point_interval_s=1200),
        submit("quick", 6, 4, team="b", user="b2", est_runtime_s=50 * 3600, safe_point_interval_s=10),
    )
    start_all(run, 2000)
    fresh_checkpoint(run, 10 * MIN, "slow", "quick")
    plan = of(
        run.at(10 * MIN + 1000, submit("fix", 1, 4, team="sre", user="o", est_runtime_s=600)),
        T.PreemptionPlanned,
    )[0]
    assert plan.victims == ["quick"]
    assert run.job("slow").safe_point_interval_ms == 1_200_000


# ---------------------------------------------------------------- compatible GPU models


SUBSTITUTES = {"H100": {"A100": 0.5}}  # an H100 job runs 1.5x as long on an A100


def _h100_busy_for(hours: float, **params) -> Run:
    run = Run(**params)
    run.at(0, node("h1", "H100"), node("a1", "A100"))
    run.at(
        1000,
        submit(
            "h-busy", 5, 8, team="x", user="x", models=["H100"], est_runtime_s=hours * 3600, preemptible=False
        ),
    )
    start_all(run, 2000)
    return run


def test_a_job_starts_on_a_compatible_model_when_the_longer_run_beats_the_wait():
    run = _h100_busy_for(10, gpu_substitutes=SUBSTITUTES)
    events = run.at(3000, submit("train", 4, 8, team="t", user="t", models=["H100"], est_runtime_s=3600))
    starts = of(events, T.JobStartRequested)
    assert [(s.job, s.nodes) for s in starts] == [("train", ["a1"])]
    check_invariants(run.state)


def test_a_job_waits_for_its_own_model_when_that_is_sooner_than_the_slowdown():
    run = _h100_busy_for(0.1, gpu_substitutes=SUBSTITUTES)  # H100 free in 6 min; 10 h x 0.5 extra
    events = run.at(3000, submit("train", 4, 8, team="t", user="t", models=["H100"], est_runtime_s=10 * 3600))
    assert not of(events, T.JobStartRequested)


def test_without_a_substitutes_table_a_job_runs_only_on_the_models_it_lists():
    run = _h100_busy_for(10)
    events = run.at(3000, submit("train", 4, 8, team="t", user="t", models=["H100"], est_runtime_s=3600))
    assert not of(events, T.JobStartRequested)


def test_a_preemption_may_free_a_compatible_model_and_prices_the_longer_run():
    """The H100 holds work that cannot be preempted; the A100 holds a level-6 job at a fresh
    checkpoint: the urgent H100 job takes the A100, its plan's cost counting the slowdown."""
    run = Run(gpu_substitutes=SUBSTITUTES)
    run.at(0, node("h1", "H100"), node("a1", "A100"))
    run.at(
        1000,
        submit(
            "h-busy", 5, 8, team="x", user="x", models=["H100"], est_runtime_s=20 * 3600, preemptible=False
        ),
        submit("a-low", 6, 8, team="y", user="y", models=["A100"], est_runtime_s=20 * 3600),
    )
    start_all(run, 2000)
    fresh_checkpoint(run, 10 * MIN, "a-low")
    events = run.at(
        10 * MIN + 1000, submit("fix", 1, 8, team="s", user="s", models=["H100"], est_runtime_s=600)
    )
    plans = of(events, T.PreemptionPlanned)
    assert plans and plans[0].victims == ["a-low"] and plans[0].placement[0].node == "a1"
    weight = run.state.canonical.policy.level_weight[1]
    assert plans[0].cost >= weight * 8 * 600 * 0.5  # the longer run on the A100
    assert "compatible GPU model" in plans[0].reason


# ---------------------------------------------------------------- draining a node for an urgent gang


def _mixed_nodes(**params) -> Run:
    """Two nodes, each with a level-0 job (which a level-1 job may not preempt) on 2 GPUs and
    a level-6 job at a fresh checkpoint on 6; n2's level-0 job ends in an hour, n1's in five.
    A stream of non-preemptible one-GPU jobs waits for any GPU that frees."""
    run = Run(**params)
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        submit("u1", 0, 2, team="ops", user="o", est_runtime_s=5 * 3600),
        submit("b1", 6, 6, team="b", user="b", est_runtime_s=20 * 3600),
    )
    run.at(
        1200,
        submit("u2", 0, 2, team="ops", user="o", est_runtime_s=3600),
        submit("b2", 6, 6, team="b", user="b2", est_runtime_s=20 * 3600),
    )
    start_all(run, 2500)
    assert [s.node for s in run.job("b1").placement] == ["n1"] and [
        s.node for s in run.job("u2").placement
    ] == ["n2"]
    run.at(
        3000,
        *[
            submit(f"s{i}", 4, 1, team="s", user="s", est_runtime_s=10 * 3600, preemptible=False)
            for i in range(4)
        ],
    )
    fresh_checkpoint(run, 10 * MIN, "b1", "b2")
    return run


def test_an_urgent_whole_node_gang_gets_a_node_drained_and_preempts_as_soon_as_a_set_exists():
    run = _mixed_nodes()
    events = run.at(10 * MIN + 1000, submit("gang", 1, 8, team="sre", user="g", est_runtime_s=3600))
    assert not of(events, T.PreemptionPlanned)  # no node can be freed by preemption now
    run.at(HOUR + 1000, T.Finished(job="u2", ok=True))
    holder = {name: job for name, (_, job) in reserved_nodes(run.state).items()}
    assert holder.get("n2") == "gang"  # drained: the waiting one-GPU jobs do not take n2
    assert [e.job for e in run.events(T.JobStartRequested) if e.job.startswith("s")] == []
    t = HOUR + 6000
    run.at(t, tick(t))
    plans = run.events(T.PreemptionPlanned)
    assert [(p.preemptor, p.victims) for p in plans] == [("gang", ["b2"])]


def test_queue_pressure_does_not_flip_an_urgent_verdict_under_load():
    """A level-1 job may take a level-6 job that has an hour of unsaved work and ten hours
    to go. A backlog of 100 level-3 gangs (waiting for a node that is down) raises the
    queue's pressure far past level 1's weight; priced at the preemptor's weight at most,
    the wasted work costs what it cost without the backlog, and the verdict stands."""

    def plan_with(backlog: int):
        run = Run()
        run.at(0, node("a1"), node("b1", "B"))
        run.at(1, T.NodeDown(node="b1"))
        run.at(1000, submit("victim", 6, 8, team="v", user="v", est_runtime_s=11 * 3600, ckpt_interval_s=0))
        start_all(run, 2000)
        run.at(HOUR, *[submit(f"q{i}", 3, 8, team="q", user=f"q{i}", models=["B"]) for i in range(backlog)])
        return of(
            run.at(HOUR + 1000, submit("fix", 1, 8, team="s", user="s", est_runtime_s=1800)),
            T.PreemptionPlanned,
        )

    quiet, loaded = plan_with(0), plan_with(100)
    assert quiet and loaded
    assert loaded[0].cost <= quiet[0].cost * run_weight_ratio()


def run_weight_ratio() -> float:
    """How much dearer wasted work may get under load: from the floor weight (1.0) up to the
    level-1 preemptor's own weight (8.0), never beyond."""
    from core.model.policy import Policy

    p = Policy()
    return p.level_weight[1] / p.wasted_work_weight_min


def test_a_recently_preempted_victim_is_weighed_below_its_preemptors_level_never_at_it():
    """A level-4 job preempted once with a boost of 3 restarts, protected, weighed at its
    boosted level. A second level-1 job may still take it: weighed at level 1 it would cost
    as much as the very wait the preemption saves, and "dearer" would become "protected"
    against a level the protection does not cover; it is weighed at level 2 at most."""
    run = Run(requeue_boost_per_preemption=3, requeue_boost_max=3, min_run_after_restart_ms=HOUR)
    run.at(0, node("a1"))
    run.at(
        1000, submit("victim", 4, 8, team="search", user="li", est_runtime_s=100 * 3600, ckpt_interval_s=0)
    )
    start_all(run, 1000)
    _victim_preempted(run, HOUR + 1000, "p1", HOUR)
    run.at(HOUR + 20 * MIN, T.Finished(job="p1", ok=True))
    start_all(run, HOUR + 21 * MIN)
    victim = run.job("victim")
    assert victim.state == "running" and victim.boost == 3 and victim.protected_until_t > HOUR + 30 * MIN
    plans = of(
        run.at(HOUR + 30 * MIN, submit("p2", 1, 8, team="safety", user="p2", est_runtime_s=3 * HOUR)),
        T.PreemptionPlanned,
    )
    assert [p.victims for p in plans] == [["victim"]]
    from core.rules.pricing import priced_level

    assert priced_level(victim, HOUR + 30 * MIN, preemptor_level=1) == 2
    assert priced_level(victim, HOUR + 30 * MIN, preemptor_level=0) == 1


def _gang_under_backlog(backlog: int) -> list:
    """A level-4 gang holds both nodes (16 GPUs, 20 h to go, checkpointed just now); `backlog`
    one-GPU level-3 jobs queue behind it; then a one-GPU level-1 job arrives."""
    run = Run()
    run.at(0, node("a1"), node("a2"))
    run.at(1000, submit("gang", 4, 16, team="train", user="g", est_runtime_s=20 * 3600))
    start_all(run, 2000)
    fresh_checkpoint(run, 10 * MIN, "gang")
    run.at(
        10 * MIN + 500,
        *[submit(f"q{i}", 3, 1, team="q", user=f"q{i}", est_runtime_s=4 * 3600) for i in range(backlog)],
    )
    return of(
        run.at(10 * MIN + 1000, submit("fix", 1, 1, team="sre", user="o", est_runtime_s=1800)),
        T.PreemptionPlanned,
    )


def test_a_gangs_gpus_the_preemptor_does_not_take_are_charged_only_where_the_queue_leaves_them_idle():
    """A one-GPU urgent job can only free a GPU by preempting a 16-GPU gang. The gang's 15
    other GPUs go to the queued jobs at once: its wait there is their gain, not a loss. A
    backlog that makes the gang's requeue wait long therefore does not make it dearer: the
    verdict for the urgent job does not flip with load."""
    quiet, loaded = _gang_under_backlog(0), _gang_under_backlog(40)
    assert [p.victims for p in quiet] == [["gang"]]
    assert [p.victims for p in loaded] == [["gang"]]
    assert loaded[0].cost <= quiet[0].cost


def test_a_victims_requeue_wait_counts_no_release_for_its_own_gpus():
    """One node, a level-6 job on its 8 GPUs with 20 h to go, a one-GPU level-1 job of 30
    min: with nobody queued ahead, the victim runs again when the preemptor ends (its GPUs
    come back to the pool with the preemption; it waits for no release of its own), so
    its displacement, 7 of its GPUs idle meanwhile, is priced at about 30 min, not 20 h."""
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("victim", 6, 8, team="v", user="v", est_runtime_s=20 * 3600))
    start_all(run, 2000)
    fresh_checkpoint(run, 10 * MIN, "victim")
    plans = of(
        run.at(10 * MIN + 1000, submit("fix", 1, 1, team="s", user="s", est_runtime_s=1800)),
        T.PreemptionPlanned,
    )
    assert [p.victims for p in plans] == [["victim"]]
    p = run.state.canonical.policy
    assert plans[0].cost < p.level_weight[6] * 8 * 2 * 1800  # well under 20 h of displacement
