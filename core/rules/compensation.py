"""When a preempted job is compensated: once its preemption count passes the threshold.

The model's spec words the trigger as the count exceeding a preset threshold
(`compensation_after_preemptions`). With `compensation_when_exceeded` the core does so
literally: with a threshold of 3, the fourth preemption is the first compensated. Off, the
third already is (the count reaches the threshold). The first compensated preemption pays for
all the progress the job lost to its preemptions so far; each later one for its own loss.

Each rule returns its verdict and its reason.
"""

from __future__ import annotations

from ..model.policy import Policy

DUE = "compensation_due"
BELOW = "compensation_after_preemptions"  # the count has not yet passed the threshold


def first_compensation(p: Policy) -> int:
    """The preemption count of a job's first compensated preemption."""
    return p.compensation_after_preemptions + (1 if p.compensation_when_exceeded else 0)


def compensation_due(p: Policy, count: int) -> tuple[bool, str]:
    """(due, why): whether a preemption that brings a job's count to `count` is compensated."""
    if count >= first_compensation(p):
        return True, DUE
    return False, BELOW


def describe(p: Policy, count: int) -> str:
    """The sentence for a job preempted `count` times."""
    due, _ = compensation_due(p, count)
    first = first_compensation(p)
    if due:
        return f"preempted {count} times: compensated (from the {ordinal(first)} preemption on)"
    return f"preempted {count} times: compensated from the {ordinal(first)} preemption on"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
