"""Keeps a job's output: reads what the job prints (its stdout and stderr, through a pipe)
and writes it to the run's `output.log`, capped and rotated, so a job printing without end
can neither fill the host's disk nor stop printing.

    python -m agents.outcap OUTPUT_FILE --max-bytes N [--floor-bytes F]

- At most N bytes on disk: when `output.log` reaches half of N it becomes `output.log.1`
  (replacing the older one) and a new `output.log` starts, with a line saying how much
  was rotated away so far; the newest output is always kept.
- The disk's last F bytes are left to others (the bus's store, the agent's state): below
  that much free space, and on a write error (a full disk), output is dropped and counted,
  never waited on, so the job never blocks on a full pipe; writing resumes once there is
  room, with a line saying how much was dropped.
- It runs as the agent's user in a session of its own, so the job can neither signal nor
  stop it; it detaches at once (the agent does not wait for it) and ends when every
  writer of the pipe is gone (the job and whatever it started).
- The run's folder belongs to the job's user, who may put a link where `output.log` goes:
  the file is opened without following a symlink, a fresh one after a rotation only if
  none is there (`O_EXCL`), and only a plain file with one link is written to, so the
  keeper never writes where the job points it.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import time

READ_BYTES = 64 * 1024
# How often free space is looked at (each look is a statvfs).
FREE_CHECK_S = 1.0
FLOOR_BYTES_DEFAULT = 8 * 1024 * 1024


class Keeper:
    """Writes chunks of output to `path`, rotating at half of `max_bytes`, dropping while the
    disk's free space is under `floor_bytes` or writes fail."""

    def __init__(self, path: str, max_bytes: int, floor_bytes: int) -> None:
        self.path = path
        self.half_bytes = max(1, max_bytes // 2)
        self.floor_bytes = floor_bytes
        self.fh = None
        self.size = 0
        self.rotated_bytes = 0
        self.dropped_bytes = 0
        self._dropping = False
        self._free_checked = 0.0
        self._room = True
        self._open()

    def _open(self, fresh: bool = False) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        if fresh:
            flags |= os.O_EXCL
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError:
            self.fh = None
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)  # a device, a fifo or a hard link someone planted: not ours to write
            self.fh = None
            return
        self.fh = os.fdopen(fd, "ab")
        self.size = st.st_size

    def _has_room(self) -> bool:
        now = time.monotonic()
        if now - self._free_checked >= FREE_CHECK_S:
            self._free_checked = now
            try:
                st = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
                self._room = st.f_bavail * st.f_frsize >= self.floor_bytes
            except OSError:
                self._room = True
        return self._room

    def write(self, chunk: bytes) -> None:
        """Keep `chunk` if there is room for it, else count it as dropped."""
        if not self._has_room() or (self.fh is None and not self._reopen()):
            self._drop(chunk)
            return
        if self._dropping:
            self._dropping = False
            self._raw(
                f"\n[xirang: {self.dropped_bytes} bytes of output dropped so far: the disk was full]\n".encode()
            )
        if self.size + len(chunk) > self.half_bytes:
            self._rotate()
        self._raw(chunk)

    def _raw(self, data: bytes) -> None:
        try:
            self.fh.write(data)
            self.fh.flush()
            self.size += len(data)
        except OSError:
            self._drop(data)
            self._room = False  # look again at the next check
            self._free_checked = time.monotonic()

    def _drop(self, chunk: bytes) -> None:
        self.dropped_bytes += len(chunk)
        self._dropping = True

    def _reopen(self) -> bool:
        self._open()
        return self.fh is not None

    def _rotate(self) -> None:
        self.rotated_bytes += self.size
        try:
            self.fh.close()
        except OSError:
            pass
        try:
            os.replace(self.path, self.path + ".1")
        except OSError:
            pass
        self._open(fresh=True)
        if self.fh is not None:
            self._raw(
                f"[xirang: output rotated; {self.rotated_bytes} bytes before this point, the last"
                f" of them in {os.path.basename(self.path)}.1]\n".encode()
            )


def keep(fd: int, keeper: Keeper) -> None:
    """Copy from `fd` to the keeper until every writer is gone."""
    while True:
        try:
            chunk = os.read(fd, READ_BYTES)
        except InterruptedError:
            continue
        if not chunk:
            return
        keeper.write(chunk)


def main(argv: list[str]) -> int:
    """Keep stdin's output in OUTPUT_FILE (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m agents.outcap")
    parser.add_argument("output")
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--floor-bytes", type=int, default=FLOOR_BYTES_DEFAULT)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    # Detach: the agent reaps the parent at once and never waits for the keeper, which
    # init adopts and reaps when the output ends.
    if os.fork():
        os._exit(0)
    keeper = Keeper(args.output, args.max_bytes, args.floor_bytes)
    keep(sys.stdin.fileno(), keeper)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
