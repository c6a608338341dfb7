"""The fairness limits on preemption: how many preemptions a team or user may suffer or
cause in the fairness window (scaled to the pool and to the team's share of the demand),
how deep a cascade of preemptions and how many levels down a team's or user's jobs may
reach (`depth_limits`), and the `Guard` on a victim set: the levels' guaranteed shares of
the pool in whole GPUs (`level_floors`) and, under the opt-in fair-share guarantee, no
victim of another team that holds no more than its fair share.
The limits guard a team or user against others, never against reordering their own work.
"""

from __future__ import annotations

from ..model.policy import Policy
from .shares import above_share, fair_shares, holding, within_share
from ..model.state import Job, State, teams_with_demand, window_count


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


def level_floors(p: Policy, total_gpus: int) -> list[int]:
    """Each level's guaranteed share of the pool in whole GPUs (rounded down: a share under
    one GPU guarantees none, rather than shielding a whole GPU)."""
    return [int(share * total_gpus + 1e-9) for share in p.guaranteed_share]


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


class Guard:
    """What a preemption may not take: GPUs a level holds within its guaranteed share of the
    pool and, when the policy guarantees fair shares, jobs of another team that holds no
    more than its fair share (a team's own jobs may still preempt each other by priority).
    `taken` maps a level and a team to the GPUs already chosen from them."""

    def __init__(self, state: State, preemptor: Job, p: Policy) -> None:
        self.state = state
        self.team = preemptor.team
        self.level_floor = level_floors(p, state.index.total_gpus)
        if preemptor.level == 0:
            # An emergency is never kept waiting by a guarantee smaller than its gang.
            self.level_floor = [floor if floor >= preemptor.gpus else 0 for floor in self.level_floor]
        self.guarantees_teams = p.fair_share_guarantee and preemptor.level >= p.fair_share_from_level
        # Shares are only weighed for a preemptor the guarantee covers (an urgent one is not).
        self.shares = fair_shares(state) if self.guarantees_teams else {}
        self.held = holding(state) if self.guarantees_teams else {}

    def allows(self, taken: dict, victim: Job) -> bool:
        """Whether `victim` may join a set that already takes `taken` (GPUs per level and
        team): its level keeps its guaranteed share and, under the fair-share guarantee,
        another team stays above its share."""
        floor = self.level_floor[victim.level]
        if (
            floor
            and self.state.index.level_gpus[victim.level] - taken.get(victim.level, 0) - victim.gpus < floor
        ):
            return False
        if not self.guarantees_teams or victim.team == self.team:
            return True
        # As in Kueue, a team may be preempted while it holds more than its share (it is
        # borrowing), and its last victim's gang may take it below: a gang is not split.
        held_now = self.held.get(victim.team, 0) - taken.get(victim.team, 0)
        return above_share(held_now, self.shares.get(victim.team, 0.0))

    @staticmethod
    def take(taken: dict, victim: Job) -> None:
        """Count `victim`'s GPUs as taken from its level and its team."""
        taken[victim.level] = taken.get(victim.level, 0) + victim.gpus
        taken[victim.team] = taken.get(victim.team, 0) + victim.gpus

    def below_share_with(self, job: Job) -> bool:
        """Whether the job's team, holding the job too, stays within its fair share."""
        if not self.guarantees_teams:
            return False
        return within_share(self.held.get(job.team, 0), job.gpus, self.shares.get(job.team, 0.0))
