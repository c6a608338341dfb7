"""Who may be the victim of one preemption decision: each rule's verdict, one victim at a
time (`victim_refusal`), and the decision's walk over the jobs holding GPUs
(`eligible_victims`). A victim must be of a level the preemptor's rights reach
(`core.rules.rights`), hold GPUs on a node of a model the preemptor accepts and not held for
another job, be the user's own when the user is past `user_preempting_max`
(`core.rules.fairness`), be shielded by nothing (`core.rules.shields`) and, for a reclaim,
keep the guarantees (`core.rules.guarantees`).

`eligible_victims` is a shortcut over `victim_refusal`: it walks only the levels in reach
and checks in the cheapest order; tests/test_eligibility.py compares the two on random
worlds. `refusals` groups the refusals of many jobs and `first_refusal` names the one an
explanation gives, so the reason a waiting job is told comes from the rules the decision
applied.
"""

from __future__ import annotations

from ..model.state import State
from ..model.entities import Job
from ..model.types import LEVELS
from .decision import Decision
from .fairness import USER_PREEMPTING
from .guarantees import LEVEL_SHARE, TEAM_SHARE, Guard
from .rights import (
    DEPTH,
    LEVELS_DOWN,
    OWN_OR_MORE_URGENT,
    PREEMPTS_FROM_LEVEL,
    RECLAIM_LEVELS,
    level_refusal,
    level_right,
)
from .shields import BUSY, NOT_PREEMPTIBLE, OWN_TEAM, RESTARTED, TEAM_PROTECTED, USER_PROTECTED, victim_shield

HELD_NODE = "held_for_reservation"  # its GPUs are on nodes promised to another queued job
OTHER_MODEL = "gpu_model"  # it holds no GPU of a model the preemptor accepts

# The order in which an explanation names the rule that shields the jobs it could preempt:
# the fairness limits first (they lift with time, and are what a user asks about), then
# the rights and the guarantees, then what frees up on its own.
NAMED_FIRST = (
    TEAM_PROTECTED,
    USER_PROTECTED,
    USER_PREEMPTING,
    DEPTH,
    LEVELS_DOWN,
    PREEMPTS_FROM_LEVEL,
    RECLAIM_LEVELS,
    TEAM_SHARE,
    LEVEL_SHARE,
    RESTARTED,
    NOT_PREEMPTIBLE,
    OWN_TEAM,
    HELD_NODE,
    BUSY,
    OWN_OR_MORE_URGENT,
)


def victim_refusal(d: Decision, guard: Guard, victim: Job, models: dict, held: dict) -> str:
    """ "" when `victim` may be taken by `d`'s preemption, else the first rule that refuses
    it: the levels in reach, the nodes (`models`: the accepted GPU models; `held`: nodes
    promised to others), the user's allowance, the victim's shields, for a reclaim the
    guarantees."""
    job = d.job
    refused = level_refusal(d.policy, job, victim.level, d.levels_down_max, d.reclaim)
    if refused:
        return refused
    nodes = d.state.canonical.nodes
    on_models = [slot.node for slot in victim.placement if nodes[slot.node].gpu_model in models]
    if not on_models:
        return OTHER_MODEL
    if all(name in held for name in on_models):
        return HELD_NODE
    if d.own_only and victim.user != job.user:
        return USER_PREEMPTING
    refused = victim_shield(d, victim)
    if refused:
        return refused
    return guard.refusal({}, victim) if d.reclaim else ""


def eligible_victims(d: Decision, guard: Guard, models: list[str], held: dict[str, int]) -> list[Job]:
    """The jobs `d`'s preemption (or reclaim) may take, by level then id: those
    `victim_refusal` refuses nothing, found by walking only the levels in reach."""
    state = d.state
    holding_by_level = state.index.holding_by_level
    model_ok = dict.fromkeys(models)
    jobs = state.canonical.jobs
    eligible = []
    for level in d.levels:
        for victim_id in sorted(holding_by_level[level]):
            victim = jobs[victim_id]
            if eligible_in_reach(d, guard, victim, model_ok, held):
                eligible.append(victim)
    return eligible


def eligible_in_reach(d: Decision, guard: Guard, victim: Job, model_ok: dict, held: dict) -> bool:
    """Whether `victim`, of a level in `d`'s reach (`d.levels`), may be taken: what
    `eligible_victims` checks of each job, cheapest check first."""
    nodes = d.state.canonical.nodes
    return (
        (not d.own_only or victim.user == d.job.user)
        and not victim_shield(d, victim)
        and (not d.reclaim or not guard.refusal({}, victim))
        and any(nodes[slot.node].gpu_model in model_ok and slot.node not in held for slot in victim.placement)
    )


def refusals(d: Decision, guard: Guard, victims, models: list[str], held: dict) -> dict[str, list[Job]]:
    """Rule -> the jobs of `victims` it refuses (those on none of the accepted models left
    out: they never could help)."""
    model_ok = dict.fromkeys(models)
    found: dict[str, list[Job]] = {}
    for victim in victims:
        refused = victim_refusal(d, guard, victim, model_ok, held)
        if refused and refused != OTHER_MODEL:
            found.setdefault(refused, []).append(victim)
    return found


def first_refusal(found: dict[str, list[Job]]) -> tuple[str, list[Job]]:
    """The rule an explanation names among `found` (`NAMED_FIRST` order), with its jobs;
    ("", []) when nothing was refused."""
    for rule in NAMED_FIRST:
        if rule in found:
            return rule, found[rule]
    return "", []


def less_urgent_holders(state: State, job: Job, reclaim: bool) -> list[Job]:
    """Every job holding GPUs that a preemption for `job` could ever consider: of the less
    urgent levels (for a reclaim, of every level), by level then id."""
    jobs = state.canonical.jobs
    first = 0 if reclaim else job.level + 1
    holding = state.index.holding_by_level
    return [jobs[victim_id] for level in range(first, LEVELS) for victim_id in sorted(holding[level])]


def may_take(d: Decision, victim: Job) -> bool:
    """Whether `d`'s preemptor may take `victim` by priority, by its level's right and the
    victim's shields alone (neither the levels-down limit nor the user's allowance): what a
    node drained for an urgent gang counts as freeable."""
    return not level_right(d.policy, d.job.level, victim.level) and not victim_shield(d, victim)
