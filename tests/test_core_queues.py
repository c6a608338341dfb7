"""Scenario tests of queue order, aging and the wait bound."""

from core import types as T
from core.passes.placement import reserved_nodes
from core.passes.queues import aging_threshold_ms

from scenario import HOUR, MIN, Run, node, of, start_all, submit, tick


def started_order(events) -> list[str]:
    return [e.job for e in of(events, T.JobStartRequested)]


def one_busy_node(level_of_busy: int = 1, **params) -> Run:
    run = Run(**params)
    run.at(0, node("a1"))
    run.at(1, submit("busy", level_of_busy, 8, team="ops", est_runtime_s=HOUR / 1000))
    start_all(run, 2)
    return run


def test_levels_are_served_in_order_and_fcfs_within_levels_0_to_2():
    run = one_busy_node()
    run.at(10, submit("b-late", 2, 2, team="x"))
    run.at(11, submit("a-early", 2, 2, team="y"))
    run.at(12, submit("urgent", 0, 2, team="z"))
    events = run.at(HOUR, T.Finished(job="busy", ok=True))
    assert started_order(events) == ["urgent", "b-late", "a-early"]


def test_fair_share_serves_the_team_furthest_below_its_quota():
    run = Run(team_quota={"big": 3.0, "small": 1.0})
    run.at(0, node("a1"))
    run.at(1, submit("busy", 1, 8, team="ops", est_runtime_s=3600))
    start_all(run, 2)
    run.at(10, *[submit(f"big-{i}", 4, 1, team="big") for i in range(6)])
    run.at(20, *[submit(f"small-{i}", 4, 1, team="small") for i in range(6)])
    events = run.at(HOUR, T.Finished(job="busy", ok=True))
    order = started_order(events)
    assert len(order) == 8
    assert sum(1 for j in order if j.startswith("big")) == 6
    assert sum(1 for j in order if j.startswith("small")) == 2


def test_round_robin_alternates_teams_at_levels_6_and_7():
    run = one_busy_node(fair_share_guarantee=False)  # else teams below their shares go first
    run.at(10, *[submit(f"a-{i}", 7, 1, team="a") for i in range(4)])
    run.at(20, *[submit(f"b-{i}", 7, 1, team="b") for i in range(2)])
    events = run.at(HOUR, T.Finished(job="busy", ok=True))
    teams = [j[0] for j in started_order(events)]
    assert teams == ["a", "b", "a", "b", "a", "a"]


def test_aging_raises_a_waiting_job_one_level_at_a_time():
    run = one_busy_node()
    run.at(10, submit("waiter", 7, 1, team="a"))
    threshold = aging_threshold_ms(run.state, 7)
    before = run.at(10 + threshold - 1, tick(10 + threshold - 1))
    assert not of(before, T.PriorityAged)
    aged = of(run.at(10 + threshold, tick(10 + threshold)), T.PriorityAged)
    assert [(a.from_level, a.to_level) for a in aged] == [(7, 6)]
    assert run.job("waiter").eff_level == 6 and run.job("waiter").level == 7


def test_aging_threshold_shrinks_as_the_queue_deepens():
    shallow = one_busy_node()
    shallow.at(10, submit("w0", 6, 1, team="a"))
    deep = one_busy_node()
    deep.at(10, *[submit(f"w{i}", 6, 1, team="a") for i in range(64)])
    assert aging_threshold_ms(deep.state, 6) < aging_threshold_ms(shallow.state, 6)


def test_aging_lifts_a_job_at_most_aging_levels_max_above_its_level():
    run = one_busy_node()
    run.at(10, submit("waiter", 7, 1, team="a"))
    for hour in range(1, 12):
        run.at(hour * HOUR, tick(hour * HOUR))
    assert run.job("waiter").eff_level == 7 - run.state.canonical.policy.aging_levels_max


def test_aged_jobs_do_not_gain_the_right_to_preempt():
    run = Run(aging_levels_max=7)
    run.at(0, node("a1"))
    run.at(1, submit("holder", 6, 8, team="ops", est_runtime_s=100 * 3600))
    start_all(run, 2)
    run.at(10, submit("old", 7, 8, team="a"))
    events = []
    for hour in range(1, 12):
        events += run.at(hour * HOUR, tick(hour * HOUR))
    assert run.job("old").eff_level == 0
    assert not of(events, T.PreemptionPlanned)


def test_aging_starts_a_starved_level_7_job_within_its_bound():
    """A stream of small level-5 jobs keeps one node busy; the big level-7 job must still
    start within: the sum of aging thresholds + the starvation guard + one job's runtime."""
    run = Run()
    p = run.state.canonical.policy
    run.at(0, node("a1"))
    run.at(1000, submit("big-batch", 7, 8, team="explore", est_runtime_s=3600))
    job_ms = 30 * MIN
    bound = sum(p.aging_threshold_ms[1:]) + p.starvation_wait_ms + job_ms
    running: dict[str, int] = {}
    started_at = None
    n = 0
    for t in range(5 * MIN, bound + 5 * MIN, 5 * MIN):
        for job_id, end in sorted(running.items()):
            if end <= t:
                run.at(t, T.Finished(job=job_id, ok=True))
                del running[job_id]
        for _ in range(2):
            n += 1
            run.at(
                t, submit(f"small-{n}", 5, 1, team=f"team{n % 3}", user=f"u{n}", est_runtime_s=job_ms / 1000)
            )
        for job_id in sorted(run.state.canonical.jobs):
            job = run.state.canonical.jobs[job_id]
            if job.state == "starting":
                run.at(t, T.Started(job=job_id))
                if job_id == "big-batch":
                    started_at = t
                else:
                    running[job_id] = t + job_ms
        if started_at is not None:
            break
    assert started_at is not None, "the level-7 job starved"
    assert started_at - 1000 <= bound


def test_recovery_boost_puts_a_preempted_job_ahead_of_its_level():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("victim", 6, 8, team="search", est_runtime_s=10 * 3600))
    start_all(run, 2000)
    run.at(HOUR, submit("urgent", 1, 8, team="safety", user="ana", est_runtime_s=600))
    run.at(HOUR + 40_000, T.Released(job="victim"))
    run.at(HOUR + 41_000, submit("peer", 6, 8, team="other", user="p"))
    start_all(run, HOUR + 50_000)
    events = run.at(HOUR + 20 * MIN, T.Finished(job="urgent", ok=True))
    assert started_order(events) == ["victim"]
    assert run.job_state("peer") == "queued"


def test_small_jobs_start_on_idle_gpus_behind_more_blocked_gangs_than_the_scan_budget():
    """Blocked 8-GPU jobs at urgent levels are skipped cheaply: they must not use up the
    pass's budget while a less urgent 1-GPU job could run on an idle GPU."""
    run = Run(scan_jobs_max=4, head_reservations_max=0)
    run.at(0, node("a1"), node("a2"))
    # Level 1: the level-1 gangs may not preempt them.
    run.at(
        1,
        submit("half", 1, 4, team="ops", est_runtime_s=3600),
        submit("other-half", 1, 4, team="ops", est_runtime_s=3600),
        submit("third", 1, 7, team="ops", est_runtime_s=3600),
    )
    start_all(run, 2)
    run.at(10, *[submit(f"gang-{i}", 1, 8, team="g") for i in range(10)])
    events = run.at(20, submit("small", 5, 1, team="s"))
    assert started_order(events) == ["small"]


def _gang_behind_small_jobs(**params) -> Run:
    run = Run(**{"fair_share_guarantee": False, **params})  # team f would reclaim its share
    run.at(0, node("a1"), node("a2"))
    # Level 3: not preemptible by the level-2 gang, so it can only wait for a node to drain.
    run.at(
        1,
        submit("long-a", 3, 7, team="ops", est_runtime_s=10 * 3600),
        submit("short-b", 3, 6, team="ops", est_runtime_s=600),
    )  # best fit: a2, 2 left
    start_all(run, 2)
    run.at(10, submit("gang", 2, 8, team="g", est_runtime_s=3600))
    run.at(20, submit("filler", 5, 2, team="f", est_runtime_s=5 * 3600))
    return run


def test_the_first_blocked_gang_gets_a_node_held_for_it_against_less_urgent_jobs():
    """EASY backfill at the head of the queue: the level-2 gang waits for a2 to drain;
    a level-5 job that would outlast the drain may not take the GPUs that are free there,
    one that ends before may."""
    run = _gang_behind_small_jobs()
    assert run.job_state("filler") == "queued"
    assert reserved_nodes(run.state)["a2"][1] == "gang"
    backfill = run.at(30, submit("tiny", 5, 2, team="f", est_runtime_s=60))
    assert started_order(backfill) == ["tiny"]
    start_all(run, 31)
    run.at(100, T.Finished(job="tiny", ok=True))
    events = run.at(600, T.Finished(job="short-b", ok=True))
    assert started_order(events) == ["gang"]
    assert run.job("gang").placement[0].node == "a2"


def test_without_head_reservations_small_jobs_keep_the_gang_waiting():
    run = _gang_behind_small_jobs(head_reservations_max=0)
    assert run.job_state("filler") == "starting"
    events = run.at(600, T.Finished(job="short-b", ok=True))
    assert "gang" not in started_order(events)


def test_a_small_teams_starving_job_does_not_wait_out_a_big_teams_backlog():
    """Two busy nodes, a backlog of older level-5 gangs from a big team, and one level-6
    gang from a team that holds nothing: once all are starving, the oldest of all holds one
    node and the small team's job the other, rather than the big team's second oldest."""

    def reserved_for(team_reservations: int) -> list[str]:
        run = Run(
            starvation_team_reservations_max=team_reservations,
            head_reservations_max=0,
            preempts_from_level=[8] * 8,
        )
        run.at(0, node("a1"), node("a2"), node("small-node", gpus=4))  # free, too small
        run.at(
            1,
            submit("long-1", 5, 8, team="big", user="b", est_runtime_s=10 * 3600),
            submit("long-2", 5, 8, team="big", user="b", est_runtime_s=11 * 3600),
        )
        start_all(run, 2)
        run.at(
            10, *[submit(f"backlog-{i}", 5, 8, team="big", user="b", est_runtime_s=3600) for i in range(5)]
        )
        run.at(10 * MIN, submit("small", 6, 8, team="small", user="s", est_runtime_s=3600))
        run.at(3 * HOUR, tick(3 * HOUR))
        return sorted(holder for _, holder in reserved_nodes(run.state).values())

    assert reserved_for(1) == ["backlog-0", "small"]
    assert reserved_for(0) == ["backlog-0"]


def test_jobs_aged_into_a_fair_share_level_queue_behind_the_jobs_that_belong_there():
    """Team a's level-4 job aged into level 3 holds no level-3 GPUs, team b holds some: by
    the level's fair share alone a would go first, but an aged job queues behind the jobs
    of the level it aged into, as at the first-come-first-served levels. Among aged jobs,
    fair share inside their own level decides: x holds level-4 GPUs, y none."""
    run = Run()
    run.at(0, node("a1"), node("a2"), node("a3"))
    run.at(1, submit("busy", 1, 8, team="ops", est_runtime_s=HOUR / 1000))
    run.at(1, submit("b-run", 3, 4, team="b", est_runtime_s=10 * HOUR / 1000))
    run.at(1, submit("x-run", 4, 4, team="x", est_runtime_s=10 * HOUR / 1000))
    run.at(1, submit("fill", 1, 8, team="ops", est_runtime_s=10 * HOUR / 1000))
    start_all(run, 2)
    run.at(10, submit("x-aged", 4, 8, team="x"))
    run.at(11, submit("y-aged", 4, 8, team="y"))
    run.at(12, submit("a-aged", 4, 8, team="a"))
    aged_t = 20 + aging_threshold_ms(run.state, 4)
    run.at(aged_t, tick(aged_t))
    assert {run.job(j).eff_level for j in ("x-aged", "y-aged", "a-aged")} == {3}
    run.at(aged_t + 1, submit("b-own", 3, 8, team="b"))
    order = [run.job("busy").id]
    for _ in range(3):
        events = run.at(aged_t + 2 + len(order), T.Finished(job=order[-1], ok=True))
        order.append(started_order(events)[0])
    assert order[1:] == ["b-own", "y-aged", "a-aged"]


def test_jobs_aged_into_a_first_come_first_served_level_keep_their_own_levels_fair_share():
    """Level 2 serves its own jobs first come first served; level-3 jobs aged into it are
    served after them by fair share inside level 3, not by age: x holds level-3 GPUs and
    y none, so y's aged job goes before x's older one."""
    run = Run()
    run.at(0, node("a1"), node("a2"), node("a3"))
    run.at(1, submit("busy", 1, 8, team="ops", est_runtime_s=HOUR / 1000))
    run.at(1, submit("x-run", 3, 8, team="x", est_runtime_s=10 * HOUR / 1000))
    run.at(1, submit("fill", 1, 8, team="ops", est_runtime_s=10 * HOUR / 1000))
    start_all(run, 2)
    run.at(10, submit("x-aged", 3, 8, team="x"))
    run.at(11, submit("y-aged", 3, 8, team="y"))
    aged_t = 20 + aging_threshold_ms(run.state, 3)
    run.at(aged_t, tick(aged_t))
    assert {run.job(j).eff_level for j in ("x-aged", "y-aged")} == {2}
    run.at(aged_t + 1, submit("z-own", 2, 8, team="z"))
    order = [run.job("busy").id]
    for _ in range(3):
        events = run.at(aged_t + 2 + len(order), T.Finished(job=order[-1], ok=True))
        order.append(started_order(events)[0])
    assert order[1:] == ["z-own", "y-aged", "x-aged"]
