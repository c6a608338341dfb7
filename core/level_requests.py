"""Who may change a job's level, and to what: anyone acting on the job (its owner) may make
it less urgent; making it more urgent needs an operator, except that the owner may take back
what they gave up themselves, up to the level they lowered it from (the level it was
submitted at, or one an operator set). One rule for the decision and its explanation.
"""

from __future__ import annotations

from .model.entities import Job
from .model.types import LEVELS


def level_request_problem(job: Job, level: int, operator: bool) -> tuple[str, str] | None:
    """(reason, detail) when `level` may not be set on `job` by this requester; None when it
    may."""
    if not 0 <= level < LEVELS:
        return "level_must_be_0_to_7", f"got level {level}"
    if level == job.level:
        return "level_unchanged", f"{job.id} is at level {job.level} already"
    if level < job.level and not operator and job.level - level > job.raisable_by_owner:
        if job.raisable_by_owner == 0:
            return (
                "raising_priority_needs_operator",
                f"{job.id} is at level {job.level}; only an operator may make it more urgent",
            )
        return (
            "raising_priority_needs_operator",
            f"{job.id} is at level {job.level}; its owner may set it back to level"
            f" {job.level - job.raisable_by_owner} (where they lowered it from), only an operator"
            " may make it more urgent than that",
        )
    return None


def raisable_by_owner_after(job: Job, level: int, operator: bool) -> int:
    """How many levels the owner may raise the job again once `level` is set: what an owner
    lowers adds up, what they take back is spent, and an operator's level is the new start."""
    if operator:
        return 0
    return max(0, job.raisable_by_owner + level - job.level)
