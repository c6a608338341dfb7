"""Every reason the core gives for not preempting, and for rolling a preemption back, shown
by a scenario that leads to it; the tables are checked against the reasons the code can
give, so a new reason needs a row here. Also the rules no other test pinned down: a
victim's failed checkpoint rolls its saga back, a saga's deadline leaves its slack, and a
team's compensation grant raises its fair share."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core import types as T
from core.log.evolve import evolve
from core.passes.plan import plan_preemption
from core.rules.shares import fair_shares
from scenario import HOUR, MIN, Run, node, of, start_all, submit, tick

CORE = Path(__file__).resolve().parent.parent / "core"
LONG_S = 10 * 3600


def busy_node(
    run: Run,
    name: str = "n1",
    level: int = 6,
    gpus: int = 8,
    job: str = "",
    team: str = "",
    model: str = "A100",
) -> str:
    """A node of `gpus` A100s, all held by one long job of `level` (of a team of its own
    unless named), started."""
    job = job or f"bg-{name}"
    t = run.t
    run.at(t, node(name, model=model, gpus=gpus))
    run.at(
        t + 1000,
        submit(
            job,
            level,
            gpus,
            team=team or f"team-{job}",
            user=f"user-{job}",
            models=[model],
            est_runtime_s=LONG_S,
        ),
    )
    start_all(run, t + 2000)
    return job


def declined(events: list[T.Event], job: str) -> list[str]:
    return [e.reason for e in of(events, T.PreemptionDeclined) if e.job == job]


# ---------------------------------------------------------------- why a preemption is declined


def no_eligible_victims() -> list[str]:
    run = Run()
    busy_node(run, level=1)
    return declined(run.at(HOUR, submit("u", 1, 8, team="x", user="x")), "u")  # same level


def benefit_below_cost() -> list[str]:
    run = Run(net_benefit_min=1e12)
    busy_node(run)
    return declined(run.at(HOUR, submit("u", 1, 8, team="x", user="x")), "u")


def no_victim_set_within_limits() -> list[str]:
    run = Run(victims_per_preemption_max=1)
    run.at(0, node("n1"))
    run.at(
        1000,
        submit("a", 6, 4, team="ta", user="a", est_runtime_s=LONG_S),
        submit("b", 6, 4, team="tb", user="b", est_runtime_s=LONG_S),
    )
    start_all(run, 2000)
    return declined(run.at(HOUR, submit("u", 1, 8, team="x", user="x")), "u")  # needs two victims


def user_preempting_limit() -> list[str]:
    run = Run(user_preempting_max=1, user_preempted_max=100, team_preempting_max=100, team_preempted_max=100)
    busy_node(run, "n1")
    busy_node(run, "n2")
    first = run.at(HOUR, submit("u1", 1, 8, team="x", user="x", est_runtime_s=600))
    assert of(first, T.PreemptionPlanned), "set-up: the user's first preemption"
    return declined(run.at(HOUR + MIN, submit("u2", 1, 8, team="x", user="x")), "u2")


def preemption_depth_limit() -> list[str]:
    # An urgent H100 job displaces "mid"; mid, requeued, could displace the level-6 job on
    # its own model's node... but a job displaced by a cascade one deep may go no deeper.
    run = Run(preemption_depth_max=1)
    busy_node(run, "h1", level=2, job="mid", model="H100")
    busy_node(run, "h2", level=6, job="low", model="H100")
    run.at(HOUR, submit("urgent", 0, 8, team="x", user="x", models=["H100"], est_runtime_s=LONG_S))
    planned = run.events(T.PreemptionPlanned)
    assert [p.victims for p in planned] == [["low"]], "set-up: the cheaper victim goes first"
    run.at(HOUR + MIN, T.SafePoint(t=0, job="low"), T.Released(t=0, job="low"))
    run.at(
        HOUR + 2 * MIN, submit("urgent-2", 0, 8, team="y", user="y", models=["H100"], est_runtime_s=LONG_S)
    )
    assert [p.victims for p in run.events(T.PreemptionPlanned)][-1] == ["mid"], "set-up: mid is displaced"
    run.at(HOUR + 3 * MIN, T.SafePoint(t=0, job="mid"), T.Released(t=0, job="mid"))
    assert run.job("mid").cascade_depth == 1 and run.job_state("mid") == "queued"
    return declined(run.at(HOUR + 4 * MIN, tick(HOUR + 4 * MIN)), "mid")


def held_back_by_reservation() -> list[str]:
    run = Run(starvation_wait_ms=MIN)
    run.at(0, node("n1", gpus=9))
    run.at(1000, submit("bg", 6, 8, team="b", user="b", est_runtime_s=LONG_S))
    start_all(run, 2000)
    run.at(3000, submit("starving", 5, 8, team="s", user="s", est_runtime_s=LONG_S))
    run.at(3 * MIN, tick(3 * MIN))  # it has waited past starvation_wait_ms: n1 is held for it
    # Level 2 may preempt level 6 but is not urgent: the hold binds it (core/rules/holds.py).
    return declined(run.at(4 * MIN, submit("u", 2, 8, team="x", user="x", est_runtime_s=LONG_S)), "u")


def no_node_of_model() -> list[str]:
    run = Run()
    busy_node(run, "n1")
    run.at(HOUR, node("h1", model="H100"))
    run.at(HOUR, submit("h-bg", 6, 8, team="h", user="h", models=["H100"], est_runtime_s=LONG_S))
    start_all(run, HOUR + 1000)
    run.at(HOUR + MIN, submit("u", 6, 8, team="x", user="x", models=["H100"]))  # waits: level 6
    run.at(HOUR + 2 * MIN, T.NodeDown(t=0, node="h1", reason="test"))
    job = run.job("u")
    job.level = 1  # as if raised to an urgent level: it may preempt, and no H100 is left
    return [plan_preemption(run.state, job).reason]


def fits_without_preemption() -> list[str]:
    # The placement pass spends its one attempt (scan_jobs_max=1) on an 8-GPU job that
    # cannot fit (4 GPUs free on each node); the 4-GPU job behind it would fit, so the
    # preemption planned for it declines.
    run = Run(scan_jobs_max=1)
    run.at(0, node("n1", model="A100"), node("n2", model="H100"))
    run.at(
        1000,
        submit("a", 0, 4, team="a", user="a", models=["A100"], est_runtime_s=LONG_S),
        submit("b", 0, 4, team="b", user="b", models=["H100"], est_runtime_s=LONG_S),
    )
    start_all(run, 2000)
    run.at(HOUR, submit("whole-node", 0, 8, team="w", user="w", models=[]))
    return declined(run.at(HOUR + MIN, submit("u", 1, 4, team="x", user="x", models=[])), "u")


def reclaim_beyond_share() -> list[str]:
    run = Run(fair_share_guarantee=True)
    busy_node(run, "n1", team="x")
    busy_node(run, "n2")
    run.at(HOUR, submit("more", 6, 8, team="x", user="x2", est_runtime_s=LONG_S))
    # team x holds 8 of the 16 GPUs, its fair share: a reclaim for it would take it beyond
    return [plan_preemption(run.state, run.job("more"), reclaim=True).reason]


DECLINES = {
    "no_eligible_victims": no_eligible_victims,
    "benefit_below_cost": benefit_below_cost,
    "no_victim_set_within_limits": no_victim_set_within_limits,
    "user_preempting_limit": user_preempting_limit,
    "preemption_depth_limit": preemption_depth_limit,
    "held_back_by_reservation": held_back_by_reservation,
    "no_node_of_model": no_node_of_model,
    "fits_without_preemption": fits_without_preemption,
    "reclaim_beyond_share": reclaim_beyond_share,
}


@pytest.mark.parametrize("reason", sorted(DECLINES))
def test_every_decline_reason_has_a_scenario_that_gives_it(reason: str):
    assert DECLINES[reason]()[:1] == [reason]


def test_the_decline_table_covers_every_reason_the_code_can_give():
    assert reasons_in_code("Decline") == set(DECLINES)


# ---------------------------------------------------------------- why a saga rolls back


def saga_with_two_victims(**policy) -> tuple[Run, T.PreemptionPlanned]:
    run = Run(**policy)
    run.at(0, node("n1"))
    run.at(
        1000,
        submit("v1", 6, 4, team="a", user="a", est_runtime_s=LONG_S, ckpt_cost_s=15),
        submit("v2", 6, 4, team="b", user="b", est_runtime_s=LONG_S, ckpt_cost_s=15),
    )
    start_all(run, 2000)
    plan = of(run.at(20 * MIN, submit("urgent", 1, 8, team="x", user="x")), T.PreemptionPlanned)[0]
    return run, plan


def rolled_back(events: list[T.Event]) -> list[str]:
    return [e.reason for e in of(events, T.PreemptionRolledBack)]


def deadline_passed() -> list[str]:
    run, plan = saga_with_two_victims()
    return rolled_back(run.at(plan.deadline_t + 1, tick(plan.deadline_t + 1)))


def preemptor_cancelled() -> list[str]:
    run, _ = saga_with_two_victims()
    return rolled_back(run.at(21 * MIN, T.Cancel(t=0, job="urgent")))


def node_lost() -> list[str]:
    run, _ = saga_with_two_victims()
    return rolled_back(run.at(21 * MIN, T.NodeDown(t=0, node="n1", reason="power")))


def victim_checkpoint_failed() -> list[str]:
    run, _ = saga_with_two_victims()
    events = run.at(21 * MIN, T.CheckpointFailed(t=0, job="v1", reason="disk full"))
    # the saga is undone: both victims keep their GPUs and go on running
    assert sorted(e.job for e in of(events, T.NoticeWithdrawn)) == ["v1", "v2"]
    assert run.job_state("v1") == run.job_state("v2") == "running"
    assert run.job_state("urgent") == "queued"
    return rolled_back(events)


ROLLBACKS = {
    "deadline_passed": deadline_passed,
    "preemptor_cancelled": preemptor_cancelled,
    "node_lost": node_lost,
    "victim_checkpoint_failed": victim_checkpoint_failed,
}


@pytest.mark.parametrize("reason", sorted(ROLLBACKS))
def test_every_rollback_reason_has_a_scenario_that_gives_it(reason: str):
    assert ROLLBACKS[reason]() == [reason]


def test_the_rollback_table_covers_every_reason_the_code_can_give():
    assert reasons_in_code("rollback") == set(ROLLBACKS)


def reasons_in_code(callee: str) -> set[str]:
    """The string reasons passed to `Decline(reason=...)` or `rollback(ctx, saga, "...")`
    anywhere in core/ (both branches of a conditional expression)."""
    found: set[str] = set()
    for path in sorted(CORE.rglob("*.py")):
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == callee):
                continue
            args = [kw.value for kw in call.keywords if kw.arg == "reason"] + call.args[2:3]
            for arg in args:
                for value in (arg.body, arg.orelse) if isinstance(arg, ast.IfExp) else (arg,):
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.add(value.value)
    return found


# ---------------------------------------------------------------- rules no other test pinned


def test_a_sagas_deadline_leaves_the_policys_slack_after_the_victims_are_expected_to_let_go():
    _, plan = saga_with_two_victims(deadline_slack_ms=30 * MIN, deadline_min_ms=MIN)
    assert plan.deadline_t - plan.t >= 30 * MIN


def test_a_teams_compensation_grant_raises_its_fair_share():
    run = Run()
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        *[
            submit(f"{team}-{i}", 6, 4, team=team, user=team, est_runtime_s=LONG_S)
            for team in ("a", "b")
            for i in range(4)
        ],
    )  # each team asks for the whole pool
    before = fair_shares(run.state)
    assert before["a"] == before["b"] == 8.0
    evolve(
        run.state,
        T.CompensationGranted(
            t=run.t, job="a-0", team="a", kind="quota_gpu_hours", amount=50.0, preempt_count=3
        ),
    )
    after = fair_shares(run.state)
    assert after["a"] > 8.0 > after["b"]
    assert after["a"] + after["b"] == pytest.approx(16.0)
