"""Each team's fair share of the pool, and what it holds against it.

A team's fair share is its max-min share of the GPUs, weighted by quota, over the teams
that hold or ask for GPUs: teams asking for less than their weighted part get all they
ask for, and the rest is split among the others by quota (water-filling). It is the
guarantee behind reclaim: a team below its share may take GPUs back from teams above
theirs, and no team's jobs preempt a team that is not above its share (see
`core.rules.eligibility`). Shares follow demand: they move as jobs arrive and end.
"""

from __future__ import annotations

from ..model.policy import Policy
from ..model.state import State, teams_with_demand
from ..model.entities import PREEMPTING, Job
from ..model.usage import decayed_gpu_ms, mean_gpus, usage_key

SHARE_EPSILON = 1e-6  # shares are fractions of GPUs; a held count equal to one is at it


def within_share(held: float, gpus: int, share: float) -> bool:
    """Whether a team holding `held` GPUs stays within its fair share taking `gpus` more."""
    return held + gpus <= share + SHARE_EPSILON


def above_share(held: float, share: float) -> bool:
    """Whether a team holding `held` GPUs holds more than its fair share (it is borrowing)."""
    return held > share + SHARE_EPSILON


def team_quota(state: State, team: str) -> float:
    """A team's fair-share weight: its quota, raised by compensation grants."""
    c = state.canonical
    entry = c.ledger.get(team)
    bonus = 0.0
    if entry is not None:
        bonus = entry.quota_gpu_hours
        if entry.quota_bonus_until_t > c.t:
            bonus += entry.quota_bonus_gpu_hours
    return c.policy.team_quota.get(team, 1.0) * (1.0 + bonus / 100.0)


def fair_shares(state: State) -> dict[str, float]:
    """Team -> GPUs of its max-min fair share (weighted by quota) of the pool."""
    ix = state.index
    teams = teams_with_demand(ix)
    demand = {team: ix.team_gpus.get(team, 0) + ix.team_queued_gpus.get(team, 0) for team in teams}
    return max_min_shares(demand, ix.total_gpus, {team: team_quota(state, team) for team in teams})


def max_min_shares(
    demand: dict[str, int], capacity: float, weight: dict[str, float] | None = None
) -> dict[str, float]:
    """Water-filling: each claimant's max-min fair share of `capacity`, weighted by
    `weight` (1 when not given). Claimants asking for less than their weighted part get
    what they ask for; the rest is split among the others by weight. The one fair-share
    function: the core's guarantee and the scorecard's fairness both use it."""
    weights = {name: (weight or {}).get(name, 1.0) for name in demand}
    left = float(capacity)
    weight_left = sum(weights.values())
    shares: dict[str, float] = {}
    # Those asking for least per unit of weight are satisfied first; ties by name.
    for name in sorted(demand, key=lambda name: (demand[name] / weights[name], name)):
        part = left * weights[name] / weight_left if weight_left > 0 else 0.0
        shares[name] = min(float(demand[name]), part)
        left -= shares[name]
        weight_left -= weights[name]
    return shares


HELD_NOW = "held_now"  # only the GPUs the team holds at the level now count
HELD_AND_USED = "held_and_used"  # and its use of the level over time, decayed


def level_share_used(p: Policy, held_gpus: int, used_gpus: float, quota: float) -> tuple[float, str]:
    """(how far into its quota, why): a team's standing inside a level, by which fair share
    serves the team furthest below its quota first. The GPUs its jobs of the level hold now
    (and those a pass has just offered them), plus, with `fair_share_half_life_s`, the GPUs
    it held there on average lately (`used_gpus`, see `level_used_gpus`), per unit of quota.
    Without the half-life the order is first come first served whenever jobs run one at a
    time (no team holds anything when the next is chosen); with it a team that ran much
    lately waits behind one that did not, so over time each is served by its quota."""
    if p.fair_share_half_life_s <= 0:
        return held_gpus / quota, HELD_NOW
    return (held_gpus + used_gpus) / quota, HELD_AND_USED


def level_used_gpus(state: State, level: int, team: str) -> float:
    """The GPUs `team` held at `level` on average lately: its use decayed by half every
    `fair_share_half_life_s`, up to now (0 when the half-life is 0)."""
    c = state.canonical
    half_life_ms = c.policy.fair_share_half_life_s * 1000.0
    if half_life_ms <= 0:
        return 0.0
    held = state.index.level_team_gpus[level].get(team, 0)
    return mean_gpus(
        decayed_gpu_ms(c.usage.get(usage_key(level, team)), held, c.t, half_life_ms), half_life_ms
    )


def holding(state: State) -> dict[str, int]:
    """Team -> GPUs it holds and keeps: victims already told to let go count as gone, so
    two reclaims in a row do not both take a team's last GPUs above its share."""
    c = state.canonical
    held = dict(state.index.team_gpus)
    for saga_id in sorted(c.sagas):
        saga = c.sagas[saga_id]
        for victim_id in saga.victims:
            victim = c.jobs.get(victim_id)
            if victim is not None and victim.state == PREEMPTING:
                held[victim.team] = held.get(victim.team, 0) - victim.gpus
    return held


def teams_below_share(state: State) -> tuple[dict[str, float], dict[str, int], list[str]]:
    """The fair shares, the GPUs each team holds (see `holding`), and the teams with queued
    jobs that have room for at least one more GPU within their shares, sorted."""
    shares = fair_shares(state)
    held = holding(state)
    below = [
        team
        for team in sorted(state.index.waiting_by_team)
        if within_share(held.get(team, 0), 1, shares.get(team, 0.0))
    ]
    return shares, held, below


RECLAIM_OFF = "fair_share_guarantee"  # the guarantee is off, or does not cover the job's level
BEYOND_SHARE = "beyond_share"  # the job would take its team beyond its share
NOTHING_LENT = "nothing_lent"  # no team holds enough GPUs above its share


def lent_gpus(shares: dict[str, float], held: dict[str, int]) -> float:
    """GPUs the teams hold above their shares: what reclaims may take back."""
    return sum(max(0.0, held.get(team, 0) - share) for team, share in shares.items())


def reclaim_refusal(p, job: Job, shares: dict[str, float], held: dict[str, int], lent: float) -> str:
    """ "" when the job's team may reclaim GPUs for it, else why not: the guarantee is off
    or does not cover its level, the job would take its team beyond its share, or the
    teams above their shares hold too few GPUs for it."""
    if not p.fair_share_guarantee or job.level < p.fair_share_from_level:
        return RECLAIM_OFF
    if not within_share(held.get(job.team, 0), job.gpus, shares.get(job.team, 0.0)):
        return BEYOND_SHARE
    if lent < 1 or job.gpus > lent + SHARE_EPSILON:
        return NOTHING_LENT
    return ""
