"""The OS users a host agent runs its jobs as.

A job must never read what its host holds: the agent's NATS credentials (with the node's
job signing key), its state folder, its checkpoint secret; nor what another job holds: its
environment and working folder (readable in /proc by any process of the same user), its
run folder and credentials. An agent running as root therefore starts each run as its own
unprivileged uid and gid, drawn from a range (`--job-uid-range`, default
DEFAULT_JOB_UID_RANGE) with no /etc/passwd entry and no supplementary groups (UidPool); the
run's folder (credentials, outbox, notice, output) is handed to that uid, and the uid is
free again once the run and every process of that uid are gone. `--job-user NAME` pins one
user for all jobs instead (jobs can then read each other's /proc entries). An agent that is
not root cannot change user: its jobs share its user, and it says so once.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("xirang.host")

JOB_USER_ENV = "XIRANG_JOB_USER"
JOB_UID_RANGE_ENV = "XIRANG_JOB_UID_RANGE"
DEFAULT_ROOT_JOB_USER = "nobody"
# Ids no distribution or tool hands out: above useradd's subordinate ids for user namespaces
# (SUB_UID_MAX 600100000) and systemd-nspawn's container ranges (up to 1879048191), below
# 2**31 (some tools read larger ids as negative). README "Jobs run as unprivileged users".
DEFAULT_JOB_UID_RANGE = "2000000000-2000065535"
UID_MIN = 1000  # below: system users
UID_MAX = 2**31 - 2
SUBORDINATE_ID_FILES = ("/etc/subuid", "/etc/subgid")
# All a root agent needs of root: start a run as its uid (SETUID, SETGID), hand it its folder
# (CHOWN), write its notices and renewed credentials there and take the folder back when the
# run ends (DAC_OVERRIDE), signal it (KILL). The deploy files grant exactly these
# (tests/test_security_job_user.py runs the agent with only these and checks the files).
AGENT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "KILL", "SETGID", "SETUID")


class JobUserError(ValueError):
    """The job user cannot be used (unknown, not allowed, or unable to run jobs here)."""


@dataclass(frozen=True)
class JobUser:
    """Another OS user than the agent's: who a job process runs as."""

    name: str
    uid: int
    gid: int
    home: str

    def popen_kwargs(self) -> dict:
        """What subprocess.Popen needs to start a process as this user (no extra groups)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def own(self, path: str | os.PathLike) -> None:
        """Hand `path` to this user (the run's folder and the files the job must use)."""
        os.chown(path, self.uid, self.gid)


def numeric_user(uid: int) -> JobUser:
    """The job user of one run: uid and gid `uid`, no passwd entry (its name says so)."""
    return JobUser(name=f"xirang-{uid}", uid=uid, gid=uid, home="/")


def process_uids() -> set[int]:
    """The real, effective and saved uids of every live process on this machine (from /proc)."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        found.update(int(part) for part in line.split()[1:4])
                        break
        except (OSError, ValueError):
            continue  # gone meanwhile
    return found


class UidPool:
    """One uid (and gid) per job run, drawn from [first, last]. A uid is drawn only when no run
    of this agent holds it (the caller says which do: its run records), no live process has it
    (a job's stray child, a run of another agent on this machine) and no passwd entry names it.
    Drawing happens under a lock file shared by the agents of one data dir, held until the
    run's process exists (lease), so two agents never draw the same uid."""

    def __init__(self, first: int, last: int, lock_path: str | os.PathLike | None = None) -> None:
        self.first, self.last = first, last
        self.name = f"uids {first}-{last}"
        self.lock_path = Path(lock_path) if lock_path else None
        self._next = first  # round robin: a freed uid is drawn again as late as possible

    def sample(self) -> JobUser:
        """A user of the range, for the start-up check (it runs nothing of a job's)."""
        return numeric_user(self.first)

    @contextlib.contextmanager
    def lease(self, held: set[int]) -> Iterator[JobUser]:
        """A free uid of the range (none of `held`, none of a live process), kept from other
        agents until the block (which starts the run's process) ends."""
        with self._locked():
            busy = held | process_uids()
            size = self.last - self.first + 1
            for step in range(size):
                uid = self.first + (self._next - self.first + step) % size
                if uid not in busy and not _has_passwd_entry(uid):
                    self._next = uid + 1 if uid < self.last else self.first
                    yield numeric_user(uid)
                    return
            raise JobUserError(
                f"--job-uid-range {self.first}-{self.last}: every uid is held by a run or a live "
                f"process; widen the range"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.lock_path is None:
            yield
            return
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def parse_uid_range(text: str) -> tuple[int, int]:
    """(first, last) of 'FIRST-LAST', checked: unprivileged ids, not handed out as any user's
    subordinate ids (/etc/subuid, /etc/subgid: a job would own that user's container files)."""
    try:
        first, last = (int(part) for part in text.split("-"))
    except ValueError:
        raise JobUserError(
            f"--job-uid-range {text!r}: write FIRST-LAST, e.g. {DEFAULT_JOB_UID_RANGE}"
        ) from None
    if not UID_MIN <= first <= last <= UID_MAX:
        raise JobUserError(
            f"--job-uid-range {text!r}: ids must run upwards within {UID_MIN}-{UID_MAX} (e.g. {DEFAULT_JOB_UID_RANGE})"
        )
    for path in SUBORDINATE_ID_FILES:
        for owner, start, count in _subordinate_ranges(path):
            if start <= last and first < start + count:
                raise JobUserError(
                    f"--job-uid-range {text!r} overlaps {owner}'s subordinate ids {start}-{start + count - 1} "
                    f"in {path}: pick ids nobody else uses (default {DEFAULT_JOB_UID_RANGE})"
                )
    return first, last


def _subordinate_ranges(path: str) -> list[tuple[str, int, int]]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found


def resolve_job_users(name: str | None, uid_range: str | None, lock_path=None) -> JobUser | UidPool | None:
    """Who an agent's jobs run as: `--job-user NAME` pins one user for all (None: the agent's
    own); otherwise an agent running as root gives each run its own uid from `uid_range`
    (default DEFAULT_JOB_UID_RANGE); an agent not running as root runs them as itself (None)."""
    if name and uid_range:
        raise JobUserError(
            "--job-user and --job-uid-range exclude each other: one user for all jobs, or one uid per run"
        )
    if name or os.geteuid() != 0:
        if uid_range:
            raise JobUserError(
                f"--job-uid-range: only an agent running as root can start jobs as other users "
                f"(this agent runs as {own_user_name()!r}); drop it or run the agent as root"
            )
        return resolve(name)
    first, last = parse_uid_range(uid_range or DEFAULT_JOB_UID_RANGE)
    return UidPool(first, last, lock_path)


def own_user_name() -> str:
    """The name of the user this process runs as."""
    return pwd.getpwuid(os.geteuid()).pw_name


def resolve(name: str | None) -> JobUser | None:
    """The job user for `name` (None: `nobody` when the agent is root, else the agent's own
    user); None when jobs run as the agent's own user (the caller warns)."""
    euid = os.geteuid()
    if not name:
        name = DEFAULT_ROOT_JOB_USER if euid == 0 else own_user_name()
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise JobUserError(
            f"--job-user {name!r}: no such user on this machine (pick an existing unprivileged user, e.g. nobody)"
        ) from None
    if entry.pw_uid == euid:
        return None
    if euid != 0:
        raise JobUserError(
            f"--job-user {name!r}: only an agent running as root can start jobs as another user "
            f"(this agent runs as {own_user_name()!r}); drop --job-user or run the agent as root"
        )
    return JobUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def warn_shared(agent_user: str) -> None:
    """One line saying that jobs run as the agent's user (and so could read its files), and
    what would change that: for an agent running as root, which named its own user with
    --job-user (or $XIRANG_JOB_USER, as `xirang up` does), not to run as root."""
    if os.geteuid() == 0:
        log.warning(
            "jobs run as %r, the agent's own user, as --job-user (or $%s) asks: they can read its"
            " credentials and state folder; leave --job-user out to start each run as its own"
            " unprivileged uid (--job-uid-range), or name an unprivileged user",
            agent_user,
            JOB_USER_ENV,
        )
        return
    log.warning(
        "jobs run as the agent's own user %r and can read its credentials and state folder; "
        "run the agent as root to start each run as its own unprivileged uid (--job-uid-range)",
        agent_user,
    )


def probe(user: JobUser, runs_dir: Path, cwd: str) -> str:
    """Why `user` could not run a job here ('' if it can): it must run this agent's python,
    import the job wrapper from `cwd`, reach the runs folder and read the TLS CA certificate."""
    check = (
        "import os, sys, agents.jobwrap\n"
        "ca = os.environ.get('XIRANG_TLS_CA', '')\n"
        "sys.exit(3 if not os.access(sys.argv[1], os.X_OK) else 4 if ca and not os.access(ca, os.R_OK) else 0)"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", check, str(runs_dir)],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=30,
            env={**os.environ, "HOME": "/"},
            **user.popen_kwargs(),
        )
    except (OSError, subprocess.SubprocessError) as err:
        return (
            f"job user {user.name!r} cannot run {sys.executable} ({err}); in a user namespace "
            f"(a container), its uid must be mapped: see /proc/self/uid_map and --job-uid-range"
        )
    if done.returncode == 0:
        return ""
    if done.returncode == 3:
        return (
            f"job user {user.name!r} cannot reach the runs folder {runs_dir}: every folder above it must "
            f"be searchable by others (e.g. chmod o+x on the data dir)"
        )
    if done.returncode == 4:
        return (
            f"job user {user.name!r} cannot read the CA certificate $XIRANG_TLS_CA "
            f"({os.environ.get('XIRANG_TLS_CA')}) its jobs need for TLS: make it (a public certificate) "
            f"readable by others"
        )
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return (
        f"job user {user.name!r} cannot run this agent's python {sys.executable} from {cwd} ({last}): "
        f"install xirang (its venv and interpreter) where that user can read it, e.g. /opt/xirang"
    )
