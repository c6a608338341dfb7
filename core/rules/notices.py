"""A preemption notice's deadline, and what a victim that lets go after it counts as.

A saga waits for its victims until its deadline, then rolls back (core/passes/saga.py). The
deadline gives the slowest victim its expected release (to its safe point, and the save the
plan asked for) plus `deadline_slack_ms`, never less than `deadline_min_ms`, and a victim
with a grace time of its own that grace plus the slack. A victim already writing a
checkpoint when the notice comes lets go only once that write ends: with
`notice_covers_save_in_progress` the deadline covers the rest of the write too, so a long
save does not roll the saga back just before the victim lets go (where the preemptor's level
waits for saves: an urgent level's bound, `release_wait_max_ms`, has its victims let go from
their last checkpoint instead).

A victim can still let go after the deadline (the withdrawal reaches it too late): its run
has ended all the same. With `late_release_counts_as_preemption` it counts as preempted, as
it was: its preemption count, recovery boost and compensation grow, and the saga's record
says it was released late (`VictimReleasedLate`).

Each rule returns its verdict and its reason.
"""

from __future__ import annotations

from ..model.entities import RUNNING, Job
from ..model.policy import Policy
from ..model.words import human_duration
from .copies import checkpoint_save_ms

# Why a deadline is what it is: the longest of these.
DEADLINE_MIN = "deadline_min_ms"
DEADLINE_RELEASE = "expected_release"
DEADLINE_GRACE = "grace"
DEADLINE_SAVE_IN_PROGRESS = "save_in_progress"

LATE_COUNTED = "released_late"
LATE_NOT_COUNTED = "late_release_counts_as_preemption"  # off: a late release is not counted
NOT_LATE = "not_overdue"  # the job was not a victim past its deadline


def save_left_ms(victim: Job, t: int, p: Policy) -> int:
    """How much of a checkpoint write in progress is left at `t` (0: none under way), every
    copy the policy asks for included (core/rules/copies.py)."""
    if not victim.ckpt_started_t:
        return 0
    return max(0, victim.ckpt_started_t + checkpoint_save_ms(victim, p) - t)


def notice_deadline(
    p: Policy, t: int, victims: list[Job], ready_ms: int, release_wait_max_ms: int = 0
) -> tuple[int, str]:
    """(deadline time, why): when a saga notified at `t` with `victims`, the slowest expected
    to let go in `ready_ms`, rolls back if a victim still holds its GPUs. The reason names
    what sets it (`DEADLINE_MIN`, `DEADLINE_RELEASE`, `DEADLINE_GRACE` or
    `DEADLINE_SAVE_IN_PROGRESS`). A write in progress is covered only where the preemptor's
    level waits for it (`release_wait_max_ms`, the level's bound on a victim's release: 0
    is none): an urgent level's victim lets go from its last checkpoint instead."""
    slack = p.deadline_slack_ms
    options = [
        (p.deadline_min_ms, DEADLINE_MIN),
        (ready_ms + slack, DEADLINE_RELEASE),
        # A victim with a grace time of its own (a job without the SDK) is given it in full.
        (max((v.grace_ms for v in victims), default=0) + slack, DEADLINE_GRACE),
    ]
    if p.notice_covers_save_in_progress:
        left = [save_left_ms(v, t, p) for v in victims]
        waited = [ms for ms in left if not release_wait_max_ms or ms <= release_wait_max_ms]
        options.append((max(waited, default=0) + slack, DEADLINE_SAVE_IN_PROGRESS))
    # The first of the longest: the reason of a tie is the earlier (plainer) one.
    wait_ms, reason = max(options, key=lambda option: option[0])
    return t + wait_ms, reason


def late_release_counts(p: Policy, job: Job) -> tuple[bool, str]:
    """(counts, why): whether a running job that reports it let go of its GPUs counts as
    preempted. It does when it was a victim still letting go at its saga's deadline
    (`job.overdue_saga`) and the policy counts late releases."""
    if job.state != RUNNING or not job.overdue_saga:
        return False, NOT_LATE
    if not p.late_release_counts_as_preemption:
        return False, LATE_NOT_COUNTED
    return True, LATE_COUNTED


def describe_deadline(reason: str, wait_ms: int) -> str:
    """The sentence for a deadline `wait_ms` after the notice, set by `reason`."""
    what = {
        DEADLINE_MIN: "the shortest deadline (deadline_min_ms)",
        DEADLINE_RELEASE: "its victims' expected release plus deadline_slack_ms",
        DEADLINE_GRACE: "a victim's own grace time plus deadline_slack_ms",
        DEADLINE_SAVE_IN_PROGRESS: "the checkpoint a victim is writing plus deadline_slack_ms",
    }[reason]
    return f"victims have {human_duration(wait_ms)} to let go: {what}"
