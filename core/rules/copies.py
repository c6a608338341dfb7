"""What a checkpoint's copies cost a job when it saves at a safe point.

A checkpoint counts as saved once `checkpoint_copies` verified copies of it exist: the bus's
store, and with two the disk of the host that wrote it (agents/ckptcopy.py). The SDK writes
the second copy while the first uploads, so a save at a notice (the victim lets go once both
are written) takes the longer of the two writes: the job's checkpoint cost for the first,
`checkpoint_copy_cost_ratio` times it for the second. A ratio up to 1 (the host's disk no
slower than the bus) adds nothing; above 1 the difference is added. A periodic save runs in
the background and pauses nothing, whatever its copies.
"""

from __future__ import annotations

from ..model.entities import Job
from ..model.policy import Policy


def checkpoint_save_ms(job: Job, p: Policy) -> int:
    """How long a save of `job`'s checkpoint at a safe point takes, all its copies written."""
    if p.checkpoint_copies < 2:
        return job.ckpt_cost_ms
    return max(job.ckpt_cost_ms, int(job.ckpt_cost_ms * p.checkpoint_copy_cost_ratio + 0.5))
