"""Whether a host's disk still has room: the agent looks before it takes new work, and
says so in its heartbeats, so a disk filled by anything (a job's files, another program)
costs new runs on this host, never the runs it already manages.

A disk is low when the free space under the agent's folder falls below its floor, or a
write there has just failed for want of space (a quota can refuse before statvfs shows
it); it is good again once the free space is back above the floor and no write has failed
for a while.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass

# What a full disk (or quota) says when a write fails.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# A write that failed for want of space keeps the disk low this long at least.
WRITE_FAILURE_HOLD_S = 10.0


def no_space(err: BaseException) -> bool:
    """Whether `err` says the disk (or the user's quota) is full."""
    return isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes free for an unprivileged writer on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass
class DiskWatch:
    """The state of the disk under `path`: `low` and, when it is, `problem` in words."""

    path: str
    floor_bytes: int
    low: bool = False
    problem: str = ""
    _failed_at: float = -1e9

    def look(self) -> bool:
        """Look again; True when `low` changed."""
        try:
            free = free_bytes(self.path)
        except OSError:
            return False
        recent_failure = time.monotonic() - self._failed_at < WRITE_FAILURE_HOLD_S
        low = free < self.floor_bytes or recent_failure
        if low:
            why = "a write failed for want of space" if recent_failure and free >= self.floor_bytes else ""
            self.problem = (
                f"disk almost full: {free // 2**20} MiB free under {self.path}"
                f" (floor {self.floor_bytes // 2**20} MiB){'; ' + why if why else ''}"
            )
        changed = low != self.low
        self.low = low
        return changed

    def write_failed(self) -> bool:
        """A write under `path` failed for want of space; True when that made the disk low."""
        self._failed_at = time.monotonic()
        return self.look()
