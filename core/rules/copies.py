"""What a checkpoint's copies cost a job when it saves at a safe point.

A checkpoint counts as saved once `checkpoint_copies` verified copies of it exist: the bus's
store, and with two the disk of the host that wrote it (agents/ckptcopy.py). The SDK writes
the second copy while the first uploads, so a save at a notice (the victim lets go once both
are written) takes the longer of the two writes: the job's checkpoint cost for the first,
`checkpoint_copy_cost_ratio` times it for the second. A ratio up to 1 (the host's disk no
slower than the bus) adds nothing; above 1 the difference is added. A periodic save runs in
the background and pauses nothing, whatever its copies.

A checkpoint a job writes itself (`xirang job checkpoint-saved --path`) is copied by its
host once the job has written it and said so (agents/pathcopy.py), and its report (with the
release after it) waits for that copy: the two writes follow each other, so a save at a
notice takes the job's checkpoint cost plus the ratio times it
(`host_copies_job_checkpoints`; a job is known to write its own once it has reported one).
"""

from __future__ import annotations

from ..model.entities import Job, is_job_written
from ..model.policy import Policy


def checkpoint_save_ms(job: Job, p: Policy) -> int:
    """How long a save of `job`'s checkpoint at a safe point takes, all its copies written."""
    if p.checkpoint_copies < 2:
        return job.ckpt_cost_ms
    second_ms = int(job.ckpt_cost_ms * p.checkpoint_copy_cost_ratio + 0.5)
    if p.host_copies_job_checkpoints and writes_own_checkpoints(job):
        return job.ckpt_cost_ms + second_ms
    return max(job.ckpt_cost_ms, second_ms)


def writes_own_checkpoints(job: Job) -> bool:
    """Whether the job's newest checkpoint is one it wrote itself (a file or folder it
    reported), not one in the SDK's store."""
    return bool(job.checkpoints) and is_job_written(job.checkpoints[-1].path)
