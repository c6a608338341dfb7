"""One preemption decision's context: the preemptor, the policy its A/B variant decides by,
its level's rights (the levels it may reach), the time, and whether it reclaims its team's
share or preempts by priority. Every rule of a preemption decision reads what it needs from
here, so a rule never takes the base policy where the variant's applies.
"""

from __future__ import annotations

from ..model.policy import Policy, with_params
from ..model.state import State
from ..model.entities import Job
from .fairness import user_preempting_limit
from .rights import depth_limits, levels_in_reach


class Decision:
    """What one preemption (or reclaim) decision for `job` reads: `policy`, the variant's;
    `t`, the time; `levels`, the levels its victims may be of (`rights.levels_in_reach`);
    `own_only`, whether its user may only displace their own jobs (past
    `user_preempting_max`); `depth_max` and `levels_down_max`, its team's and user's
    cascade limits."""

    __slots__ = (
        "state",
        "job",
        "policy",
        "t",
        "reclaim",
        "own_only",
        "depth_max",
        "levels_down_max",
        "levels",
    )

    def __init__(self, state: State, job: Job, reclaim: bool = False) -> None:
        self.state = state
        self.job = job
        self.policy = variant_policy(state, job)
        self.t = state.canonical.t
        self.reclaim = reclaim
        self.own_only = bool(user_preempting_limit(state, job))
        self.depth_max, self.levels_down_max = depth_limits(self.policy, job)
        self.levels = levels_in_reach(self.policy, job, self.levels_down_max, reclaim)


def variant_policy(state: State, job: Job) -> Policy:
    """The policy an A/B variant's jobs are decided by: the base policy with the variant's
    overrides. Cached per variant until the next PolicyChanged."""
    base = state.canonical.policy
    overrides = base.ab_variants.get(job.variant)
    if not overrides:
        return base
    cache = state.scratch.variant_policies
    if job.variant not in cache:
        cache[job.variant] = with_params(base, overrides)
    return cache[job.variant]
