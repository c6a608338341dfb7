"""One preemption decision's context (core/rules/decision.py): the policy an A/B variant
decides by, the levels its rights reach, and the user's allowance, read once."""

from __future__ import annotations

import msgspec

from core.model.entities import Window
from core.rules.decision import Decision, variant_policy
from scenario import HOUR, Run, node, submit


def test_a_variants_jobs_are_decided_by_the_variants_policy():
    run = Run(ab_variants={"control": {}, "cheap": {"net_benefit_min": 5.0}})
    run.at(0, node("a1"))
    run.at(HOUR, submit("j", 1, 1))
    state = run.state
    job = msgspec.structs.replace(state.canonical.jobs["j"], variant="cheap")
    d = Decision(state, job)
    assert d.policy.net_benefit_min == 5.0 and d.policy is variant_policy(state, job)
    plain = msgspec.structs.replace(job, variant="")
    assert Decision(state, plain).policy is state.canonical.policy


def test_the_context_reads_the_rights_and_the_allowance():
    run = Run(preemption_levels_down_max=2, user_preempting_max=1)
    run.at(0, node("a1"))
    run.at(HOUR, submit("j", 1, 1, user="u1"))
    state = run.state
    job = state.canonical.jobs["j"]
    d = Decision(state, job)
    assert (list(d.levels), d.levels_down_max, d.own_only, d.t) == ([2, 3], 2, False, HOUR)
    state.canonical.user_windows["u1"] = Window(preempting=[HOUR - 1])
    assert Decision(state, job).own_only
    assert list(Decision(state, job, reclaim=True).levels) == [2, 3]
