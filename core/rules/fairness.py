"""The fairness limits on preemption: how many preemptions a team or user may suffer or
cause in the fairness window (scaled to the pool and to the team's share of the demand).
A team preempted too often is protected (`team_preempted_max`; the victim's side is
`core.rules.shields`), a team that preempted too often is downgraded (its new urgent jobs
enter a level lower until its quota recovers: `team_downgrade_ends_t`), and a user who
preempted others too often may only displace their own jobs (`user_preempting_limit`).
The limits guard a team or user against others, never against reordering their own work.
"""

from __future__ import annotations

from ..model.words import human_duration
from ..model.state import State, teams_with_demand
from ..model.entities import Job, window_count


def team_limit(state: State, team: str, per_100_gpus: int) -> int:
    """A team's fairness count: the pool-scaled limit for a team with an even share of the
    demand, times its own share (GPUs it holds and asks for, against the mean per team
    with demand). A team bringing half the work may preempt, and be preempted, as often
    as its size warrants; a small team is held to the base limit."""
    ix = state.index
    base = scaled_limit(state, per_100_gpus)
    total = sum(ix.team_gpus.values()) + sum(ix.team_queued_gpus.values())
    own = ix.team_gpus.get(team, 0) + ix.team_queued_gpus.get(team, 0)
    if not total or not own:
        return base
    return max(base, base * own * len(teams_with_demand(ix)) // total)


def quota_recovers_t(times: list[int], limit: int, window_ms: int) -> int:
    """When a team's preemptions in the window fall back below its limit: `times` holds the
    window's entries, oldest first; once all but the newest `limit - 1` have left the
    window (each leaves `window_ms` after it), the team is under its limit again (0: it
    already is, whatever the window holds)."""
    if len(times) < max(1, limit):
        return 0
    return times[len(times) - max(1, limit)] + window_ms


def team_downgrade_ends_t(state: State, team: str) -> int:
    """When the team's downgrade ends: when its preemption quota recovers, read now. The
    `TeamDowngraded` event announced the time the quota recovers at the team's allowance
    then; the allowance follows the team's share of the demand, so the downgrade ends as
    soon as the preemptions still in the window are fewer than the allowance now (never
    later than announced). 0 when the team is not downgraded."""
    c = state.canonical
    announced = c.team_downgraded_until.get(team, 0)
    if announced <= c.t:
        return announced
    win = c.team_windows.get(team)
    if win is None:
        return 0
    p = c.policy
    times = win.preempting
    live = times[len(times) - window_count(times, c.t, p.fairness_window_ms) :]
    return min(
        announced,
        quota_recovers_t(live, team_limit(state, team, p.team_preempting_max), p.fairness_window_ms),
    )


def scaled_limit(state: State, per_100_gpus: int) -> int:
    """A fairness count for a 100-GPU pool, scaled to this pool (never below the count)."""
    return max(per_100_gpus, per_100_gpus * state.index.total_gpus // 100)


USER_PREEMPTING = "user_preempting_max"


def user_preempting_limit(state: State, job: Job) -> str:
    """ "" while the job's user may still preempt others' jobs, else the limit
    (`user_preempting_max` in the fairness window, scaled to the pool): past it, the user
    may only displace their own."""
    c = state.canonical
    win = c.user_windows.get(job.user)
    if win is None:
        return ""
    exhausted = window_count(win.preempting, c.t, c.policy.fairness_window_ms) >= scaled_limit(
        state, c.policy.user_preempting_max
    )
    return USER_PREEMPTING if exhausted else ""


def describe_user_preempting(state: State, job: Job) -> str:
    """The sentence for a user past `user_preempting_max`."""
    c = state.canonical
    p = c.policy
    win = c.user_windows.get(job.user)
    count = window_count(win.preempting, c.t, p.fairness_window_ms) if win is not None else 0
    return (
        f"user {job.user} has preempted others' jobs {count} times in the last"
        f" {human_duration(p.fairness_window_ms)}, the limit (user_preempting_max, scaled to the"
        f" pool) is {scaled_limit(state, p.user_preempting_max)}"
    )
