"""Durable, private-from-the-start file replacement: for what a host must not forget
(acted.json, run records, the outbox's facts, a job's exit status), the keys and credentials
(signing key, NKEY seeds, creds files, TLS keys) and small local state (notices read).

After a power cut the file is whole, either its old content or its new one, never empty or
partial: write a temporary file beside it, fsync it, rename it over the target (atomic), then
fsync the folder so the rename itself is on disk. A failure half-way leaves the target as it
was and no temporary file behind.

A secret never exists, even for a moment, with a wider mode than asked: the temporary file is
created with its final mode (`os.open` with O_CREAT|O_EXCL, so never an existing file or a
symlink someone planted, whose mode would be kept), never chmod-ed after the write; the
umask can only narrow it. Each write has its own temporary name, so two writers of one file
never write into each other's temporary file.

It lives in `trust`, the lowest layer that may touch files, so that `trust` (keys) and every
layer above (agents, projections) share this one copy.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

TMP_SUFFIX = ".tmp"
PRIVATE_MODE = 0o600  # readable and writable by its owner only: keys, seeds, credentials
PRIVATE_FOLDER_MODE = 0o700  # a folder only its owner may list or enter: keys/, creds/
# The temporary name `write_durably` gives a write: ".NAME.<pid>-<8 hex>.tmp".
_TEMP_NAME = re.compile(r"^\..+\.(?P<pid>[0-9]+)-[0-9a-f]{8}" + re.escape(TMP_SUFFIX) + "$")
DEFAULT_MODE = 0o666  # as `open` creates files: what the umask leaves of it


def write_durably(
    path: str | os.PathLike,
    data: bytes,
    mode: int = DEFAULT_MODE,
    owner: tuple[int, int] | None = None,
    exclusive: bool = False,
) -> Path:
    """Replace `path`'s content with `data`, durably (see the module's docstring). The file is
    created with `mode` (less the umask) from its first moment; `owner` (uid, gid) hands it to
    another user before it takes its place. `exclusive`: create it only if there is none
    (FileExistsError otherwise, the existing file untouched: a secret made once, by whichever
    of two processes comes first, and never read half-written by the other). Returns the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, mode)  # fails before anything of ours exists: nothing to clean up
    try:
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)  # atomic, and never over an existing name (rename would replace it)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)
    return path


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def sync_folder(folder: str | os.PathLike) -> None:
    """fsync a folder: makes the names created, renamed or removed in it durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_folder(folder: str | os.PathLike) -> Path:
    """Make `folder` (and its missing parents, with the default mode) a folder only its owner
    may list or enter. A new one is created with that mode (never briefly wider); an existing
    one is narrowed to it. A symlink or a file in its place is refused (NotADirectoryError):
    someone else may have planted it. Returns the path."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, PRIVATE_FOLDER_MODE)
    except FileExistsError:
        if folder.is_symlink() or not folder.is_dir():
            raise NotADirectoryError(
                f"{folder} is not a folder (a symlink or a file): move it away"
            ) from None
    os.chmod(folder, PRIVATE_FOLDER_MODE, follow_symlinks=False)  # what an old version left wider
    return folder


def remove_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that writers killed mid-write (SIGKILL, power cut) left in
    `folder`: those named as `write_durably` names them whose process is gone. A live
    writer's temporary file is kept (its pid still runs). Returns the paths removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for path in sorted(folder.iterdir()):
        match = _TEMP_NAME.match(path.name)
        if match and not _process_runs(int(match["pid"])) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _process_runs(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it runs
    return True
