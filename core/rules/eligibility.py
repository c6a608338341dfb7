"""Who may preempt and who may be a victim: a job preempts only jobs of the levels its
level may preempt (never its own level or a more urgent one), a reclaim only other teams'
jobs of the levels the fair-share guarantee covers; a victim must be running, preemptible,
in no saga, past its restart protection, and not of a team or user protected from others.
"""

from __future__ import annotations

from .fairness import Guard, depth_limits, scaled_limit
from ..model.policy import Policy
from ..model.state import RUNNING, Job, State, window_count
from ..model.types import LEVELS


def may_preempt(state: State, job: Job) -> bool:
    """Whether the job's level may preempt at all (`preempts_from_level` names a level below
    it)."""
    return state.canonical.policy.preempts_from_level[job.level] < LEVELS


def victim_eligible(state: State, preemptor: Job, victim: Job) -> bool:
    """A victim by priority: of a level the preemptor's level may preempt."""
    p = state.canonical.policy
    if victim.level < p.preempts_from_level[preemptor.level] or victim.level <= preemptor.level:
        return False
    return victim_preemptible_now(state, victim, preemptor)


def reclaim_victim_eligible(state: State, preemptor: Job, victim: Job) -> bool:
    """A victim of a reclaim: another team's job of a level reclaim may take (never the
    urgent levels), whatever the preemptor's level."""
    if victim.level < state.canonical.policy.fair_share_from_level or victim.team == preemptor.team:
        return False
    return victim_preemptible_now(state, victim, preemptor)


def victim_preemptible_now(state: State, victim: Job, preemptor: Job) -> bool:
    """Running, preemptible, in no saga, past its restart protection, and, unless the
    preemptor is of its own team (user), its team (user) not protected: the fairness
    limits protect a team and a user from others, not from reordering their own work."""
    c = state.canonical
    p = c.policy
    t = c.t
    if victim.state != RUNNING or not victim.preemptible or victim.saga:
        return False
    if victim.protected_until_t > t and (preemptor.level >= p.urgent_levels or p.restart_protect_from_urgent):
        # Bounded restart protection, never against the urgent levels by default (there the
        # recovery boost prices the victim dearer instead: `core.rules.pricing.priced_level`).
        return False
    if victim.team != preemptor.team and c.team_protected_until.get(victim.team, 0) > t:
        return False
    if victim.user == preemptor.user:
        return True
    win = c.user_windows.get(victim.user)
    if win is not None and window_count(win.preempted, t, p.fairness_window_ms) >= scaled_limit(
        state, p.user_preempted_max
    ):
        return False
    return True


def user_preempting_exhausted(state: State, job: Job) -> bool:
    """Whether the job's user has preempted others' jobs as often as the window allows."""
    c = state.canonical
    win = c.user_windows.get(job.user)
    if win is None:
        return False
    return window_count(win.preempting, c.t, c.policy.fairness_window_ms) >= scaled_limit(
        state, c.policy.user_preempting_max
    )


def eligible_victims(
    state: State,
    job: Job,
    p: Policy,
    guard: Guard,
    models: list[str],
    held: dict[str, int],
    reclaim: bool,
    own_only: bool,
) -> list[Job]:
    """The jobs a preemption (or reclaim) for `job` may take, by level then id: eligible by
    priority (or reclaim), only the user's own when the user is past the allowance, within
    the guard for a reclaim, with GPUs on a node of an accepted model not held for others."""
    c = state.canonical
    ix = state.index
    model_ok = dict.fromkeys(models)
    if reclaim:
        first_level, eligible_now = p.fair_share_from_level, reclaim_victim_eligible
    else:
        first_level, eligible_now = max(p.preempts_from_level[job.level], job.level + 1), victim_eligible
    last_level = min(LEVELS, job.level + depth_limits(p, job)[1] + 1)  # levels down, at most
    jobs = c.jobs
    nodes = c.nodes
    eligible = []
    for level in range(first_level, last_level):
        for victim_id in sorted(ix.holding_by_level[level]):
            victim = jobs[victim_id]
            if (
                (not own_only or victim.user == job.user)
                and eligible_now(state, job, victim)
                and (not reclaim or guard.allows({}, victim))
                and any(
                    nodes[slot.node].gpu_model in model_ok and slot.node not in held
                    for slot in victim.placement
                )
            ):
                eligible.append(victim)
    return eligible
