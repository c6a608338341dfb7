"""Which A/B variant of the policy a job is decided under: a hash of its team, user, job
group or id (`Policy.ab_split_by`), so the same unit always lands in the same variant."""

from __future__ import annotations

import hashlib
from typing import Any


def job_group(job: str) -> str:
    """A job's group: its id without a trailing index (`sweep-lr-12` -> `sweep-lr`)."""
    head = job.rstrip("0123456789")
    if head != job and head[-1:] in ("-", "_", "."):
        return head[:-1]
    return job


def assignment_unit(split_by: str, team: str, user: str, job: str) -> str:
    """The key a job is assigned to a variant by."""
    if split_by == "team":
        return team
    if split_by == "user":
        return user
    if split_by == "job_group":
        return job_group(job)
    return job


def assign_variant(policy: Any, team: str, job: str, user: str = "") -> str:
    """Deterministic A/B assignment under `policy` (a `Policy`): the same team (user, job
    group, job) always lands in the same variant."""
    if not policy.ab_variants:
        return ""
    names = sorted(policy.ab_variants)
    key = assignment_unit(policy.ab_split_by, team, user, job)
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return names[bucket % len(names)]
