"""Which node holds bind a job, and the victim cap (core/rules/holds.py), as tables."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Job
from core.model.policy import Policy
from core.rules.holds import overrides_hold, victim_cap
from scenario import Run, node

P = Policy()  # urgent_levels 2; preempts_from_level [1, 2, 4, 6, 7, 8, 8, 8]


def job(level: int, gpus: int = 8) -> Job:
    return Job(
        id=f"j{level}", team="t", user="u", kind="job", level=level, requested_level=level, eff_level=level,
        gpus=gpus, gpu_models=["A100"], est_runtime_ms=1, ckpt_interval_ms=0, ckpt_cost_ms=0,
        restore_cost_ms=0, preemptible=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("level", "holder", "overrides"),
    [
        (0, 6, True),  # an urgent job whose level may preempt the holder's
        (1, 1, False),  # its own level binds it
        (0, None, False),
        (2, 6, False),  # not urgent: every hold binds it
        (1, 7, True),
    ],
)
def test_overrides_hold_table(level, holder, overrides):
    assert overrides_hold(P, job(level), None if holder is None else job(holder)) is overrides


def test_no_override_when_the_policy_says_holds_bind_everyone():
    p = msgspec.structs.replace(P, urgent_override_holds=False)
    assert not overrides_hold(p, job(0), job(6))


@pytest.mark.parametrize(("gpus", "cap_max", "cap"), [(1, 8, 8), (8, 8, 8), (9, 8, 16), (32, 2, 8)])
def test_the_victim_cap_is_per_node_the_gang_needs(gpus, cap_max, cap):
    run = Run(victims_per_preemption_max=cap_max)
    run.at(0, node("a1"), node("a2"))
    state = run.state
    assert victim_cap(state, state.canonical.policy, job(1, gpus), ["A100"]) == cap
