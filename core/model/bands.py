"""The levels' bands, and the recovery boost within them: the vocabulary of the opt-in
`recovery_boost_within_band` (the rule's sentence for `explain` is core/rules/recovery.py).

A band is the urgent levels, then each run of consecutive levels above them served by one
queue policy (by default levels 0-1, level 2, levels 3-5, levels 6-7). The model's rule
(rule 26): a victim returns with a temporary priority boost that grows with its preemption
count and the wait it has borne, plus the compensation's boost once it is compensated. By
default the boost lifts the job that many levels, across the levels above it. With
`recovery_boost_within_band` it stops at the top of the job's own band: a victim still
queues ahead of its own level's newcomers but no longer ahead of levels that never
preempted it. It lives here, below the index, because the index prices victims by the level
they return to (`core.model.state.requeue_level_under`).
"""

from __future__ import annotations

from .policy import Policy
from .types import LEVELS

BOOSTED = "recovery_boost"
CAPPED_AT_BAND = "recovery_boost_within_band"


def band_top(p: Policy, level: int) -> int:
    """The most urgent level of `level`'s band: the urgent levels are one band, and above
    them each run of consecutive levels with the same queue policy is one."""
    urgent = min(p.urgent_levels, LEVELS)
    if level < urgent:
        return 0
    top = level
    while top - 1 >= urgent and p.queue_policy[top - 1] == p.queue_policy[level]:
        top -= 1
    return top


def requeue_boost(p: Policy, level: int, boost: int) -> tuple[int, str]:
    """(levels the victim rises, why): `boost` levels (rule 26's count, wait and
    compensation), within its band with `recovery_boost_within_band`."""
    lifted = max(0, level - boost)
    if not p.recovery_boost_within_band:
        return level - lifted, BOOSTED
    top = band_top(p, level)
    if lifted < top:
        return level - top, CAPPED_AT_BAND
    return level - lifted, BOOSTED
