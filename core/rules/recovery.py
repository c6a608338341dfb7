"""Why a requeued victim queues where it does, in words: its recovery boost stopped at the
top of its band (`recovery_boost_within_band`, core/model/bands.py `requeue_boost`, which
the requeue and the victim's price both apply).
"""

from __future__ import annotations

from ..model.bands import CAPPED_AT_BAND, requeue_boost
from ..model.entities import Job
from ..model.policy import Policy
from ..model.state import recovery_boost


def describe_band(p: Policy, job: Job) -> str:
    """For a queued victim whose boost stopped at its band's top: the sentence saying so
    (else ""). Its count and the wait it had borne are as they were at its requeue (both
    change only when it runs again)."""
    if not p.recovery_boost_within_band or not job.preempt_count:
        return ""
    boost = recovery_boost(p, job.preempt_count, job.waited_total_ms)
    if requeue_boost(p, job.level, boost)[1] != CAPPED_AT_BAND:
        return ""
    return (
        f"back from a preemption, it queues at level {job.eff_level}: its recovery boost stops at"
        f" the top of its band (recovery_boost_within_band), not at level {max(0, job.level - boost)}"
    )
