"""One instance per place: a lock file held (flock) for as long as its holder lives, so a
second `xirang up` in a folder in use, a second embedded NATS on one store, or a second
agent for one node refuses to start, naming the process that holds the place.

The kernel drops a flock when the last descriptor of it closes, so a holder killed with
SIGKILL leaves no stale lock behind; the pid written in the file only tells people who
holds it. A child that must keep the place after its parent dies (the embedded
nats-server) inherits the descriptor.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path


class AlreadyRunning(RuntimeError):
    """The place is held by another live process."""


class InstanceLock:
    """An exclusive flock on a file that says one process holds a place (a data folder, a NATS
    store): a second live holder is refused with `AlreadyRunning`."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self.fd: int | None = None

    def acquire(self) -> "InstanceLock":
        """Take the lock or raise `AlreadyRunning` naming the holder; the lock file records this
        process's pid."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise AlreadyRunning(
                f"{self.what} is already running ({holder}; lock {self.path}): stop it first,"
                " or use another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode())
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        """Let go of the lock (the file stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "InstanceLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096) or b"{}")
        return f"pid {info['pid']}, since {info['since']}"
    except (OSError, ValueError, KeyError):
        return "pid unknown"
