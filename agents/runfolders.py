"""Run folders: where a host agent keeps one run of a job, `runs/<job>-<record n>-<secret>/`.

The runs folder is search-only for others (0711) so that a job can reach its own folder by
name. By default each run has its own uid (agents/jobuser.py) and its folder is that uid's
alone (0700); with `--job-user` all jobs share one OS user, and then the name must be
unguessable, or a job knowing another running job's name and start record (both in the log)
could open its `nats.creds`. The agent draws a random 128-bit secret for each run folder and
keeps the folder's path in its own run record (`runs/<job>.json`, 0600); after a restart it
finds its runs again from those records, and a run it started but had not recorded yet by
listing the runs folder for the run's prefix (only the agent's user may list it).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from transport.bus import node_token

SECRET_BYTES = 16  # 128 bits: not guessable, not even by a job trying names for its whole run


def new_run_folder(runs_dir: Path, job: str, n: int) -> Path:
    """A fresh, unguessable folder path for the run of `job` started by record `n` (not created)."""
    return runs_dir / f"{_prefix(job, n)}{secrets.token_hex(SECRET_BYTES)}"


def run_folders(runs_dir: Path, job: str, n: int) -> list[Path]:
    """The existing folders of the run of `job` started by record `n`, oldest first (the
    agent's user, or root, lists the runs folder; a job cannot)."""
    token = node_token(job)
    found = [folder for folder in runs_dir.glob(f"{_prefix(job, n)}*") if run_of(folder.name) == (token, n)]
    return sorted(found, key=lambda folder: (folder.stat().st_mtime, folder.name))


def run_of(name: str) -> tuple[str, int] | None:
    """(job token, record n) of a run folder's name; None for a name that is not one."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not _is_secret(parts[2]):
        return None
    return parts[0], int(parts[1])


def _is_secret(text: str) -> bool:
    return len(text) == 2 * SECRET_BYTES and all(c in "0123456789abcdef" for c in text)


def _prefix(job: str, n: int) -> str:
    return f"{node_token(job)}-{n}-"
