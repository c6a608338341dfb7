"""The guarantees a victim set keeps (core/rules/guarantees.py), as a table: a level's
guaranteed share in whole GPUs, an emergency's exemption from a share smaller than its gang,
and, under the fair-share guarantee, another team's share."""

from __future__ import annotations

import msgspec
import pytest

from core.model.policy import Policy
from core.rules.guarantees import LEVEL_SHARE, TEAM_SHARE, Guard, describe, level_floors
from scenario import HOUR, Run, node, start_all, submit


@pytest.mark.parametrize(
    ("shares", "gpus", "floors"),
    [
        ([0.0] * 8, 16, [0] * 8),
        ([0.5, 0, 0, 0, 0, 0, 0, 0.25], 16, [8, 0, 0, 0, 0, 0, 0, 4]),
        ([0.03] + [0.0] * 7, 16, [0] * 8),  # under one GPU guarantees none
        ([0.1] + [0.0] * 7, 30, [3] + [0] * 7),
    ],
)
def test_level_floors_are_whole_gpus_rounded_down(shares, gpus, floors):
    assert level_floors(Policy(guaranteed_share=shares), gpus) == floors


def pool(**policy):
    """Two 8-GPU nodes: team a holds 12 GPUs at level 6 (three 4-GPU jobs), team b 4, and
    team c asks for 16 (fair shares: b 4, a and c 6 each)."""
    run = Run(**policy)
    run.at(0, node("n1"), node("n2"))
    jobs = [submit(f"a{i}", 6, 4, team="a", user=f"a{i}", est_runtime_s=36000) for i in range(3)]
    run.at(1000, *jobs, submit("b0", 6, 4, team="b", user="b0", est_runtime_s=36000))
    start_all(run, 2000)
    run.at(3000, submit("c0", 6, 16, team="c", user="c0", est_runtime_s=36000))
    run.state.canonical.t = HOUR
    return run.state


def preemptor(state, level, team):
    gpus = 16 if level == 0 else 4
    return msgspec.structs.replace(state.canonical.jobs["b0"], id="p", level=level, team=team, gpus=gpus)


# (policy, preemptor level, team, victims already taken, victim, refusal)
CASES = [
    ({}, 1, "c", [], "a0", ""),
    # level 6 keeps half the pool (8 GPUs) of its 16: two 4-GPU victims, not three
    ({"guaranteed_share": [0, 0, 0, 0, 0, 0, 0.5, 0]}, 1, "c", ["a1"], "a0", ""),
    ({"guaranteed_share": [0, 0, 0, 0, 0, 0, 0.5, 0]}, 1, "c", ["a1", "a2"], "a0", LEVEL_SHARE),
    # an emergency is not kept waiting by a share smaller than its gang (here 8 < 12)
    ({"guaranteed_share": [0, 0, 0, 0, 0, 0, 0.5, 0]}, 0, "c", ["a1", "a2"], "a0", ""),
    # under the fair-share guarantee team a holds 12, above its share of 6: it may lose GPUs while above it, and its last gang may take it below
    ({"fair_share_guarantee": True}, 3, "c", [], "a0", ""),
    ({"fair_share_guarantee": True}, 3, "c", ["a1"], "a0", ""),
    ({"fair_share_guarantee": True}, 3, "c", ["a1", "a2"], "a0", TEAM_SHARE),
    ({"fair_share_guarantee": True}, 3, "c", [], "b0", TEAM_SHARE),  # b holds less than its share
    ({"fair_share_guarantee": True}, 3, "b", [], "b0", ""),  # a team's own jobs, by priority
    ({"fair_share_guarantee": True}, 1, "c", [], "b0", ""),  # the urgent levels are not covered
]


@pytest.mark.parametrize(("policy", "level", "team", "taken", "victim", "refusal"), CASES)
def test_guard_refusal_table(policy, level, team, taken, victim, refusal):
    state = pool(**policy)
    guard = Guard(state, preemptor(state, level, team), state.canonical.policy)
    so_far: dict = {}
    for job_id in taken:
        guard.take(so_far, state.canonical.jobs[job_id])
    assert guard.refusal(so_far, state.canonical.jobs[victim]) == refusal
    if refusal:
        assert describe(refusal, [state.canonical.jobs[victim]])


def test_an_opened_guard_refuses_nothing():
    state = pool(fair_share_guarantee=True, guaranteed_share=[0, 0, 0, 0, 0, 0, 1.0, 0])
    guard = Guard(state, preemptor(state, 3, "c"), state.canonical.policy).opened()
    assert all(not guard.refusal({}, job) for job in state.canonical.jobs.values())
