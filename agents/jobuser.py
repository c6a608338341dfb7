"""The OS user a host agent runs its jobs as.

A job must never read what its host holds: the agent's NATS credentials (with the node's
job signing key), its state folder, its checkpoint secret. An agent running as root
therefore starts every job as an unprivileged user (`--job-user`, default `nobody`): the
run's own folder (its credentials, outbox, notice, output) is handed to that user, while
the agent's own files stay private to the agent's user. An agent that is not root cannot
change user: its jobs share its user, and it says so once.
"""

from __future__ import annotations

import logging
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("xirang.host")

JOB_USER_ENV = "XIRANG_JOB_USER"
DEFAULT_ROOT_JOB_USER = "nobody"


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
    """One line saying that jobs run as the agent's user (and so could read its files)."""
    log.warning(
        "jobs run as the agent's own user %r and can read its credentials and state folder; "
        "run the agent as root to start them as an unprivileged --job-user (default nobody)",
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
        return f"job user {user.name!r} cannot run {sys.executable} ({err})"
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
