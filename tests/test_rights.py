"""A level's right to preempt (core/rules/rights.py), as a table: which victim levels each
rule refuses and by which name, and the victim search's shortcut (`levels_in_reach`) against
the rule (`level_refusal`) on every level pair of many policies."""

from __future__ import annotations

import random

import pytest

from core.model.policy import Policy
from core.model.entities import Job
from core.model.types import LEVELS
from core.rules.rights import (
    DEPTH,
    LEVELS_DOWN,
    OWN_OR_MORE_URGENT,
    PREEMPTS_FROM_LEVEL,
    RECLAIM_LEVELS,
    depth_limits,
    depth_refusal,
    level_refusal,
    level_right,
    levels_in_reach,
    may_preempt,
)


def job(level: int, team: str = "t", user: str = "u", cascade_depth: int = 0) -> Job:
    return Job(
        id="j", team=team, user=user, kind="job", level=level, requested_level=level, eff_level=level,
        gpus=1, gpu_models=[], est_runtime_ms=1, ckpt_interval_ms=0, ckpt_cost_ms=0, restore_cost_ms=0,
        preemptible=True, cascade_depth=cascade_depth,
    )  # fmt: skip


DEFAULT = Policy()  # preempts_from_level [1, 2, 4, 6, 7, 8, 8, 8]

# (preemptor level, victim level, levels down allowed, reclaim, the rule that refuses or "")
CASES = [
    (0, 1, 7, False, ""),
    (0, 0, 7, False, OWN_OR_MORE_URGENT),
    (3, 2, 7, False, OWN_OR_MORE_URGENT),
    (2, 3, 7, False, PREEMPTS_FROM_LEVEL),  # level 2 preempts from level 4 on
    (2, 4, 7, False, ""),
    (3, 5, 7, False, PREEMPTS_FROM_LEVEL),  # level 3 preempts levels 6-7 only
    (3, 6, 7, False, ""),
    (5, 7, 7, False, PREEMPTS_FROM_LEVEL),  # level 5 preempts nothing
    (1, 6, 1, False, LEVELS_DOWN),  # only one level down
    (1, 2, 1, False, ""),
    (4, 3, 7, True, ""),  # a reclaim takes any covered level, more urgent ones too
    (4, 1, 7, True, RECLAIM_LEVELS),  # below fair_share_from_level (2)
    (2, 5, 2, True, LEVELS_DOWN),  # the levels-down limit holds for a reclaim too
]


@pytest.mark.parametrize(("preemptor", "victim", "down", "reclaim", "refused"), CASES)
def test_level_refusal_table(preemptor, victim, down, reclaim, refused):
    assert level_refusal(DEFAULT, job(preemptor), victim, down, reclaim) == refused


@pytest.mark.parametrize(("level", "may"), [(0, True), (3, True), (4, True), (5, False), (7, False)])
def test_which_levels_may_preempt_at_all(level, may):
    assert may_preempt(DEFAULT, level) is may


def test_the_level_right_ignores_the_levels_down_limit():
    assert level_right(DEFAULT, 1, 6) == ""
    assert level_refusal(DEFAULT, job(1), 6, 1, False) == LEVELS_DOWN


@pytest.mark.parametrize(
    ("team_depth", "user_depth", "cascade", "refused"),
    [
        ({}, {}, 0, ""),
        ({}, {}, 1, ""),
        ({}, {}, 2, DEPTH),
        ({"t": 1}, {}, 1, DEPTH),
        ({}, {"u": 3}, 2, DEPTH),
    ],
)
def test_a_cascade_stops_at_the_stricter_of_team_and_user_depth(team_depth, user_depth, cascade, refused):
    p = Policy(
        preemption_depth_max=2, team_preemption_depth_max=team_depth, user_preemption_depth_max=user_depth
    )
    preemptor = job(1, cascade_depth=cascade)
    assert depth_refusal(preemptor, depth_limits(p, preemptor)[0]) == refused


def test_levels_in_reach_is_exactly_the_levels_the_rule_allows():
    rng = random.Random(7)
    for _ in range(300):
        first = [rng.randint(level + 1, LEVELS) for level in range(LEVELS)]
        p = Policy(preempts_from_level=first, fair_share_from_level=rng.randint(0, LEVELS))
        down = rng.randint(0, LEVELS)
        for level in range(LEVELS):
            for reclaim in (False, True):
                allowed = [v for v in range(LEVELS) if not level_refusal(p, job(level), v, down, reclaim)]
                assert list(levels_in_reach(p, job(level), down, reclaim)) == allowed, (
                    first,
                    level,
                    down,
                    reclaim,
                )
