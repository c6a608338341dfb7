"""The guarantees a victim set keeps: each level keeps its guaranteed share of the pool in
whole GPUs (`guaranteed_share`, `level_floors`; an emergency is never kept waiting by a
guarantee smaller than its gang) and, under the opt-in fair-share guarantee, no victim is
of another team holding no more than its fair share (`fair_share_guarantee`; a team's own
jobs may still preempt each other by priority).

`Guard.refusal` returns "" when a victim may join a set, else the guarantee's name.
"""

from __future__ import annotations

from ..model.policy import Policy
from ..model.state import State
from ..model.entities import Job
from .shares import above_share, fair_shares, holding, within_share

LEVEL_SHARE = "guaranteed_share"
TEAM_SHARE = "fair_share_guarantee"


def level_floors(p: Policy, total_gpus: int) -> list[int]:
    """Each level's guaranteed share of the pool in whole GPUs (rounded down: a share under
    one GPU guarantees none, rather than shielding a whole GPU)."""
    return [int(share * total_gpus + 1e-9) for share in p.guaranteed_share]


class Guard:
    """What a preemption may not take: GPUs a level holds within its guaranteed share of the
    pool and, when the policy guarantees fair shares, jobs of another team that holds no
    more than its fair share. `taken` maps a level and a team to the GPUs already chosen
    from them."""

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

    def refusal(self, taken: dict, victim: Job) -> str:
        """ "" when `victim` may join a set that already takes `taken` (GPUs per level and
        team), else the guarantee it would break: its level's guaranteed share or, under
        the fair-share guarantee, its team's share."""
        floor = self.level_floor[victim.level]
        if (
            floor
            and self.state.index.level_gpus[victim.level] - taken.get(victim.level, 0) - victim.gpus < floor
        ):
            return LEVEL_SHARE
        if not self.guarantees_teams or victim.team == self.team:
            return ""
        # As in Kueue, a team may be preempted while it holds more than its share (it is
        # borrowing), and its last victim's gang may take it below: a gang is not split.
        held_now = self.held.get(victim.team, 0) - taken.get(victim.team, 0)
        return "" if above_share(held_now, self.shares.get(victim.team, 0.0)) else TEAM_SHARE

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

    def opened(self) -> "Guard":
        """This guard with neither guarantee: what a set could take were they lifted (the
        explanation's question: is it the guarantees that leave no set?)."""
        open_guard = object.__new__(Guard)
        open_guard.state = self.state
        open_guard.team = self.team
        open_guard.level_floor = [0] * len(self.level_floor)
        open_guard.guarantees_teams = False
        open_guard.shares = {}
        open_guard.held = {}
        return open_guard


def describe(guarantee: str, victims: list[Job]) -> str:
    """The sentence for a guarantee that leaves no victim set among `victims`."""
    if guarantee == TEAM_SHARE:
        teams = ", ".join(sorted(dict.fromkeys(v.team for v in victims)))
        return (
            f"the teams it could preempt ({teams}) hold no more than their fair shares (fair_share_guarantee)"
        )
    return "the levels it could preempt hold no more than their guaranteed shares (guaranteed_share)"
