"""A victim's shield (core/rules/shields.py), as a table: each shield by name, in the order
they are checked, and whose preemptions each one protects from."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Window
from core.rules.decision import Decision
from core.rules.shields import (
    BUSY,
    NOT_PREEMPTIBLE,
    OWN_TEAM,
    RESTARTED,
    TEAM_PROTECTED,
    USER_PROTECTED,
    describe,
    victim_shield,
)
from scenario import HOUR, Run, node, start_all, submit

T0 = HOUR


def world():
    """A running level-6 victim (team v, user v) and a queued preemptor, the clock at T0."""
    run = Run(user_preempted_max=1, min_run_after_restart_ms=600_000)
    run.at(0, node("a1"))
    run.at(1000, submit("victim", 6, 8, team="v", user="v", est_runtime_s=10 * 3600))
    start_all(run, 2000)
    run.state.canonical.t = T0
    return run.state


# (preemptor level, team, user, reclaim, changes to the victim, protected team?, user
#  preempted in the window?, the shield or "")
CASES = [
    (1, "p", "p", False, {}, False, False, ""),
    (1, "p", "p", False, {"state": "starting"}, False, False, BUSY),
    (1, "p", "p", False, {"saga": "s1"}, False, False, BUSY),
    (1, "p", "p", False, {"preemptible": False}, False, False, NOT_PREEMPTIBLE),
    # restart protection holds against levels from urgent_levels (2) on, not against urgent ones
    (3, "p", "p", False, {"protected_until_t": T0 + 1}, False, False, RESTARTED),
    (1, "p", "p", False, {"protected_until_t": T0 + 1}, False, False, ""),
    (1, "p", "p", False, {}, True, False, TEAM_PROTECTED),
    (1, "v", "p", False, {}, True, False, ""),  # a team is not protected from itself
    (1, "p", "p", False, {}, False, True, USER_PROTECTED),
    (1, "v", "v", False, {}, False, True, ""),  # nor a user
    (3, "v", "x", True, {}, False, False, OWN_TEAM),  # a reclaim takes other teams' jobs
    (3, "p", "x", True, {}, False, False, ""),
]


@pytest.mark.parametrize(
    ("level", "team", "user", "reclaim", "changes", "team_hit", "user_hit", "shield"), CASES
)
def test_victim_shield_table(level, team, user, reclaim, changes, team_hit, user_hit, shield):
    state = world()
    c = state.canonical
    victim = msgspec.structs.replace(c.jobs["victim"], **changes)
    if team_hit:
        c.team_protected_until["v"] = T0 + 1
    if user_hit:
        c.user_windows["v"] = Window(preempted=[T0 - 1000])
    preemptor = msgspec.structs.replace(victim, id="p", level=level, team=team, user=user, state="queued")
    d = Decision(state, preemptor, reclaim)
    assert victim_shield(d, victim) == shield
    if shield:
        assert describe(d, shield, [victim])


def test_restart_protection_holds_against_urgent_levels_when_the_policy_says_so():
    state = world()
    state.canonical.policy = msgspec.structs.replace(state.canonical.policy, restart_protect_from_urgent=True)
    victim = msgspec.structs.replace(state.canonical.jobs["victim"], protected_until_t=T0 + 1)
    preemptor = msgspec.structs.replace(victim, id="p", level=0, team="p", user="p", state="queued")
    assert victim_shield(Decision(state, preemptor), victim) == RESTARTED
