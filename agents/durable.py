"""Durable file replacement for what a host must not forget (acted.json, run records, the
outbox's facts, a job's exit status): after a power cut the file is whole, either its old
content or its new one, never empty or partial.

The standard sequence: write a temporary file beside it, flush and fsync it, rename it over
the target (atomic), then fsync the folder so the rename itself is on disk. A failure half-way
leaves the target as it was and no temporary file behind.
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def write_durably(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path`'s content with `data`, durably (see the module's docstring)."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: str | os.PathLike) -> None:
    """fsync a folder: makes the names created, renamed or removed in it durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
