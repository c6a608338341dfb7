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
import secrets
from pathlib import Path

TMP_SUFFIX = ".tmp"
PRIVATE_MODE = 0o600  # readable and writable by its owner only: keys, seeds, credentials
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
