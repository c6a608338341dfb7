"""Runs one job command and records how it ended, so a host agent restarted after a crash
(no longer the job's parent, so unable to wait for it) still learns the exit status.

    python -m agents.jobwrap EXIT_FILE -- COMMAND...

The wrapper shares the job's process group: the host agent signals the group. The wrapper
itself survives the notices and SIGTERM (the job decides what they mean) and dies with
the group on SIGKILL, leaving no exit file: the agent then knows the job was killed.

A record it cannot write (a full disk) costs the job nothing: the job runs all the same,
and the wrapper ends with the job's exit status as its own (128 + N for signal N, as a
shell says it), which the agent, its parent, reads when the exit file is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from trust.durable import write_durably

STARTED_FILE = "started.json"


def _ignore(_signum, _frame) -> None:
    return None


def main(argv: list[str]) -> int:
    """Run the command after `--`, record its start, wait for it and write its exit status to
    EXIT_FILE."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m agents.jobwrap EXIT_FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, command = argv[0], argv[2:]
    # Handlers, not SIG_IGN: an ignored disposition would be inherited by the job.
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    # The host's own record of when this run held its GPUs (`xirang chaos` checks that two
    # runs of one job never did at once): the start here, the end in the exit file.
    _write_json(os.path.join(os.path.dirname(exit_file) or ".", STARTED_FILE), {"t": time.time()})
    try:
        proc = subprocess.Popen(command)
    except OSError as err:
        print(f"jobwrap: cannot start {command[0]!r}: {err}", file=sys.stderr)
        rc = 127
    else:
        rc = proc.wait()
    _write_json(exit_file, {"rc": rc, "t": time.time()})
    return status_of(rc)


def status_of(rc: int) -> int:
    """A job's exit status as a process's own: a signal N (rc -N) as 128 + N."""
    return 128 - rc if rc < 0 else rc & 0xFF


def rc_of_status(status: int) -> int:
    """`status_of` read back: 128 + N as killed by signal N (rc -N)."""
    return 128 - status if 128 < status < 160 else status


def _write_json(path: str, value: dict) -> None:
    try:
        write_durably(path, json.dumps(value).encode())
    except OSError as err:  # e.g. a full disk: the job must not pay for the record
        print(f"jobwrap: cannot record {os.path.basename(path)}: {err}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
