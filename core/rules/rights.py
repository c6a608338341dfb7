"""A level's right to preempt: a job may preempt only jobs of a less urgent level (never its
own level or a more urgent one), of the levels its level may preempt (`preempts_from_level`),
and no further below its own level than its team's and user's `preemption_levels_down_max`
allows; a preemption displaced by a cascade as deep as `preemption_depth_max` preempts no
further. A reclaim takes back a team's fair share from jobs of the levels the guarantee
covers (`fair_share_from_level`), whatever the preemptor's level.

Each rule returns "" when it allows, else its name (the policy parameter behind it).
`levels_in_reach` is the decision's shortcut over `level_refusal`: the range of levels it
allows (tests/test_rights.py compares the two on every level pair and policy).
"""

from __future__ import annotations

from ..model.policy import Policy
from ..model.entities import Job
from ..model.types import LEVELS

OWN_OR_MORE_URGENT = "own_or_more_urgent_level"  # never a policy's choice: always refused
PREEMPTS_FROM_LEVEL = "preempts_from_level"
LEVELS_DOWN = "preemption_levels_down_max"
DEPTH = "preemption_depth_max"
RECLAIM_LEVELS = "fair_share_from_level"


def may_preempt(p: Policy, level: int) -> bool:
    """Whether a level may preempt at all (`preempts_from_level` names a level below it)."""
    return p.preempts_from_level[level] < LEVELS


def level_right(p: Policy, preemptor_level: int, victim_level: int) -> str:
    """The level's own right: "" when a job of `preemptor_level` may preempt one of
    `victim_level` by priority, else the rule that forbids it."""
    if victim_level <= preemptor_level:
        return OWN_OR_MORE_URGENT
    if victim_level < p.preempts_from_level[preemptor_level]:
        return PREEMPTS_FROM_LEVEL
    return ""


def level_refusal(p: Policy, job: Job, victim_level: int, levels_down_max: int, reclaim: bool) -> str:
    """ "" when a preemption (or reclaim) for `job` may take a victim of `victim_level`, else
    the rule that forbids it: the level's right, or how far down its team and user may go."""
    if reclaim:
        if victim_level < p.fair_share_from_level:
            return RECLAIM_LEVELS
    else:
        refused = level_right(p, job.level, victim_level)
        if refused:
            return refused
    if victim_level > job.level + levels_down_max:
        return LEVELS_DOWN
    return ""


def levels_in_reach(p: Policy, job: Job, levels_down_max: int, reclaim: bool) -> range:
    """The levels `level_refusal` allows, as a range (what the victim search walks)."""
    first = p.fair_share_from_level if reclaim else max(p.preempts_from_level[job.level], job.level + 1)
    return range(first, min(LEVELS, job.level + levels_down_max + 1))


def depth_limits(p: Policy, job: Job) -> tuple[int, int]:
    """(cascade depth, levels down) the job may preempt at: the stricter of its team's and
    its user's limits, each defaulting to the policy's."""
    depth = min(
        p.team_preemption_depth_max.get(job.team, p.preemption_depth_max),
        p.user_preemption_depth_max.get(job.user, p.preemption_depth_max),
    )
    down = min(
        p.team_preemption_levels_down_max.get(job.team, p.preemption_levels_down_max),
        p.user_preemption_levels_down_max.get(job.user, p.preemption_levels_down_max),
    )
    return depth, down


def depth_refusal(job: Job, depth_max: int) -> str:
    """ "" when a job displaced by a cascade may start one more level of it, else the rule."""
    return DEPTH if job.cascade_depth + 1 > depth_max else ""


def describe(p: Policy, job: Job, rule: str, levels: list[int], levels_down_max: int) -> str:
    """The sentence for a rule of this module that keeps the jobs of `levels` from being
    `job`'s victims."""
    named = ", ".join(str(level) for level in levels)
    if rule == PREEMPTS_FROM_LEVEL:
        first = p.preempts_from_level[job.level]
        reach = f"levels {first}-{LEVELS - 1}" if first < LEVELS else "no level"
        return (
            f"the jobs holding the GPUs it needs are of level(s) {named}, and level {job.level}"
            f" may preempt only {reach} (preempts_from_level)"
        )
    if rule == LEVELS_DOWN:
        return (
            f"the jobs it could preempt are of level(s) {named}, more than {levels_down_max}"
            f" level(s) below its own (preemption_levels_down_max)"
        )
    if rule == RECLAIM_LEVELS:
        return (
            f"the jobs holding the GPUs it needs are of level(s) {named}, below the levels a"
            f" reclaim may take ({p.fair_share_from_level} on, fair_share_from_level)"
        )
    if rule == DEPTH:
        return (
            f"it was displaced by a cascade of preemptions {job.cascade_depth} deep, and its team"
            " and user may not go deeper (preemption_depth_max)"
        )
    return f"the jobs holding the GPUs it needs are of level(s) {named}, its own or more urgent"
