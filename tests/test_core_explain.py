"""Why a queued job waits (core/explain.py): each reason names what blocks the job, the
fairness limit included, and explaining changes neither the state nor what step decides."""

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import types as T
from core.explain import explain, explain_queue, human_duration
from core.model.state import live_digest

from random_world import run_world
from scenario import HOUR, MIN, Run, node, of, start_all, submit


def preempt_cycle(run: Run, t: int, preemptor: str, team: str, user: str):
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


def test_a_job_blocked_by_a_protected_team_names_team_preempted_max():
    run = Run(team_preempted_max=2, team_preempting_max=100, user_preempting_max=100)
    fill_nodes(run, 3)
    assert preempt_cycle(run, 20 * MIN, "p1", "prod", "a") is not None
    assert preempt_cycle(run, 21 * MIN, "p2", "prod", "b") is not None
    assert preempt_cycle(run, 22 * MIN, "p3", "prod", "c") is None
    why = explain(run.state, "p3")
    assert why.code == "fairness_limit" and why.limit == "team_preempted_max"
    assert "research" in why.reason and "team_preempted_max" in why.reason


def test_a_user_past_the_allowance_is_told_user_preempting_max():
    run = Run(user_preempting_max=1, user_preempted_max=100, team_preempting_max=100, team_preempted_max=100)
    fill_nodes(run, 2)
    assert preempt_cycle(run, 20 * MIN, "p1", "prod", "a") is not None
    assert preempt_cycle(run, 21 * MIN, "p2", "prod", "a") is None
    why = explain(run.state, "p2")
    assert (why.code, why.limit) == ("fairness_limit", "user_preempting_max")
    assert "user a" in why.reason


def test_a_capped_victim_set_names_victims_per_preemption_max():
    run = Run(victims_per_preemption_max=2)
    run.at(0, node("a1"))
    run.at(1000, *[submit(f"one-{i}", 6, 2, user=f"u{i}", est_runtime_s=10 * 3600) for i in range(4)])
    start_all(run, 2000)
    run.at(HOUR, submit("urgent", 1, 8, team="safety", user="ana"))
    why = explain(run.state, "urgent")
    assert why.limit == "victims_per_preemption_max"


def test_a_declined_preemption_gives_benefit_against_cost():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("long", 6, 8, est_runtime_s=600, ckpt_interval_s=36000))
    start_all(run, 2000)
    run.at(9 * MIN, submit("soon", 1, 8, team="safety", user="ana", est_runtime_s=60))
    why = explain(run.state, "soon")
    declined = of(run.events(), T.PreemptionDeclined)[-1]
    assert why.code == "preemption_declined"
    assert (why.benefit, why.cost) == (declined.benefit, declined.cost) and why.benefit <= why.cost
    assert "declined" in why.reason
    assert why.start_in_ms is not None and why.start_in_ms <= 2 * MIN


def test_jobs_behind_more_urgent_levels_and_their_expected_start():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("running", 5, 8, est_runtime_s=3600))
    start_all(run, 2000)
    run.at(
        3000, submit("urgent-wait", 5, 8, team="t2", user="u2"), submit("late", 6, 4, team="t3", user="u3")
    )
    why = explain(run.state, "late")
    assert why.code in ("priority", "team_at_share")
    assert why.start_in_ms is not None and why.start_in_ms > 0


def test_a_job_no_node_could_ever_hold_is_refused_at_submit_with_the_reason():
    run = Run()
    run.at(0, node("a1"), node("a2"), node("h1", "H100"))
    events = run.at(
        1000,
        submit("wrong-model", 5, 1, models=["B200"]),
        submit("huge", 5, 17),
        submit("across", 5, 16),
        submit("any-model-huge", 5, 24, models=[]),
    )
    rejected = {e.job: e for e in of(events, T.InputRejected)}
    assert (
        rejected["wrong-model"].reason == "no_node_of_model"
        and "A100, H100" in rejected["wrong-model"].detail
    )
    assert rejected["huge"].reason == "gang_larger_than_pool" and "at most 16" in rejected["huge"].detail
    assert rejected["any-model-huge"].reason == "gang_larger_than_pool"  # a gang stays on one model
    assert "across" not in rejected and run.job("across") is not None


def test_a_submit_is_checked_against_every_node_known_with_its_latest_inventory():
    run = Run()
    run.at(0, node("a1"), node("a2"), node("h1", "H100"))
    run.at(1000, T.NodeDown(node="a2"), T.NodeDown(node="h1"))
    run.at(2000, node("h1", "B200", 4))  # back with another inventory
    events = run.at(
        3000,
        submit("a100-gang", 5, 16),  # a2 is down, but the pool has known it: it may come back
        submit("h100", 5, 1, models=["H100"]),
        submit("b200-gang", 5, 8, models=["B200"]),
        submit("b200", 5, 4, models=["B200"]),
    )
    rejected = {e.job: e for e in of(events, T.InputRejected)}
    assert sorted(rejected) == ["b200-gang", "h100"]
    assert rejected["h100"].reason == "no_node_of_model" and "A100, B200" in rejected["h100"].detail
    assert (
        rejected["b200-gang"].reason == "gang_larger_than_pool"
        and "at most 4" in rejected["b200-gang"].detail
    )


def test_an_empty_pool_refuses_nothing_yet():
    run = Run()
    assert not of(run.at(1000, submit("early", 5, 8)), T.InputRejected)


def test_a_job_whose_models_nodes_are_gone_says_so():
    run = Run()
    run.at(0, node("a1"), node("h1", "H100"))
    run.at(
        1000,
        submit("on-h100", 5, 8, models=["H100"]),
        submit("big", 6, 16, models=["A100"]),
        submit("fill-h", 5, 8, team="x", models=["H100"]),
    )
    run.at(2000, T.NodeDown(node="h1"))
    gone = explain(run.state, "fill-h")
    assert gone.code == "no_node_of_model" and gone.start_in_ms is None and "H100" in gone.reason
    assert "models up: A100" in gone.reason


def test_explaining_changes_neither_the_state_nor_the_next_decision():
    run = Run(team_preempted_max=2, team_preempting_max=100, user_preempting_max=100)
    fill_nodes(run, 3)
    preempt_cycle(run, 20 * MIN, "p1", "prod", "a")
    run.at(21 * MIN, submit("w", 6, 8, team="x", user="y"))
    twin = copy.deepcopy(run.state)
    before = live_digest(run.state)
    reasons = explain_queue(run.state)
    assert set(reasons) >= {"w", "p1"} and live_digest(run.state) == before
    from core import step

    _, explained = step(run.state, T.Tick(t=25 * MIN))
    _, plain = step(twin, T.Tick(t=25 * MIN))
    assert [r.hash for r in explained] == [r.hash for r in plain]


def test_durations_read_as_people_say_them():
    assert [human_duration(ms) for ms in (0, 45_000, 600_000, 4_320_000, 3 * 86_400_000)] == [
        "0s",
        "45s",
        "10m",
        "1h12m",
        "3d",
    ]


CODES = {
    "no_node_of_model",
    "gang_too_large",
    "node_cordoned",
    "held",
    "preempting",
    "retry_backoff",
    "starts_next_pass",
    "preemption_next_pass",
    "fairness_limit",
    "preemption_declined",
    "reservation",
    "team_at_share",
    "priority",
    "resources",
}


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=10_000))
def test_on_random_worlds_every_waiting_job_has_a_reason_and_explaining_changes_no_decision(seed):
    def explain_all(state, inp, records, before) -> None:
        if records and records[-1].n % 7 == 0:
            reasons = explain_queue(state)
            assert all(why.code in CODES and why.reason for why in reasons.values()), reasons

    explained = run_world(seed, 300, explain_all)
    plain = run_world(seed, 300)
    assert [r.hash for r in explained.records] == [r.hash for r in plain.records]


def test_a_gang_blocked_by_levels_it_may_not_preempt_is_told_preempts_from_level():
    # Level 3 may preempt levels 6-7 only. The one node its 8-GPU gang fits on is held by a
    # level-5 job and a level-7 one; a level-5 job runs on a smaller node.
    run = Run()
    run.at(0, node("a1"), node("b1", gpus=4))
    run.at(
        1000,
        submit("five-a", 5, 4, team="t5", user="u5", est_runtime_s=10 * 3600),
        submit("five-b", 5, 4, team="t5", user="u6", est_runtime_s=10 * 3600),
        submit("seven", 7, 4, team="t7", user="u7", est_runtime_s=10 * 3600),
    )
    start_all(run, 2000)
    assert [slot.node for slot in run.job("seven").placement] == ["a1"]
    run.at(HOUR, submit("gang", 3, 8, team="g", user="g"))
    run.at(HOUR + MIN, T.Tick(t=0))
    assert run.job("gang").last_decline == "no_victim_set_within_limits"
    why = explain(run.state, "gang")
    # not "takes more than victims_per_preemption_max jobs": two jobs hold the node
    assert (why.limit, why.decline) == ("preempts_from_level", "no_victim_set_within_limits")
    assert "level(s) 5" in why.reason and "victims_per_preemption_max" not in why.reason


def test_victims_beyond_the_levels_down_limit_are_named_by_that_limit():
    run = Run(preemption_levels_down_max=1)
    run.at(0, node("a1"))
    run.at(1000, submit("six", 6, 8, team="t6", user="u6", est_runtime_s=10 * 3600))
    start_all(run, 2000)
    run.at(HOUR, submit("urgent", 1, 8, team="u", user="u"))
    assert run.job("urgent").last_decline == "no_eligible_victims"
    why = explain(run.state, "urgent")
    # not "their users were preempted too often": no one was preempted
    assert why.limit == "preemption_levels_down_max" and why.decline == "no_eligible_victims"
    assert "preempted too often" not in why.reason and "level(s) 6" in why.reason


def test_a_job_on_gpus_the_last_pass_holds_for_another_is_told_whom_for():
    # The level-3 gang heads its level and may preempt nothing on a1: the pass holds a1 for
    # it. A long level-6 job that would fit on the 4 free GPUs does not start there.
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("run4", 5, 4, team="r", user="r", est_runtime_s=3600))
    start_all(run, 2000)
    run.at(MIN, submit("big", 3, 8, team="b", user="b", est_runtime_s=3600))
    run.at(2 * MIN, submit("small", 6, 4, team="s", user="s", est_runtime_s=10 * 3600))
    run.at(3 * MIN, T.Tick(t=0))
    assert run.job_state("small") == "queued"
    why = explain(run.state, "small")
    # not "free: it starts at the scheduler's next pass"
    assert why.code == "reservation" and "held for big" in why.reason
    assert "waiting for its reservation" in explain(run.state, "big").reason
