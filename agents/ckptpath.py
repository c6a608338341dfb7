"""Checkpoints a job writes itself (torch.save, torch.distributed.checkpoint, Lightning, HF
Trainer, DeepSpeed), e.g. to a shared filesystem, and reports with `xirang job
checkpoint-saved --path P`: their digests and the roots they must lie under.

- A digest names the content. A file: `sha256:<hex>` of its bytes. A folder (a sharded
  checkpoint): `sha256-tree:<hex>` over its manifest, one line per entry in sorted order,
  `F <relative path> <size> <sha256 of the file>` for a file and `L <relative path> <target>`
  for a symbolic link (never followed), so a file renamed, added, removed or changed
  changes the digest.
- Allowed roots. Each host agent has checkpoint roots (`xirang agent --ckpt-root DIR`,
  shared filesystems; by default `<data-dir>/ckpt`), and a job may report only paths under
  its own folder in one of them (`<root>/<job as one path token>`, `$XR_CKPT_DIR` for the
  first root, all of them in `$XR_CKPT_ROOTS`): a job cannot point the scheduler, or its own
  resume, at another job's files. A path is judged once its symbolic links are resolved.
- A location in the SDK's own store is written `xr-ckpt:<node>/<slot>`; it is not a file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from trust.natsauth import job_token

SDK_SCHEME = "xr-ckpt:"
CHUNK_BYTES = 1 << 20


def is_file_path(path: str) -> bool:
    """Whether a reported checkpoint location is a file or folder (not the SDK's store)."""
    return bool(path) and not path.startswith(SDK_SCHEME)


def _file_sha256(path: Path) -> tuple[str, int]:
    """(sha256 hex, bytes) of a regular file. Anything else a job put in its checkpoint (a
    FIFO, a device) is refused before a byte is read: opened without waiting (a FIFO with no
    writer would otherwise hold the reader, its host's agent, forever) and checked on the
    open file itself, so nothing swapped in after a look gets read either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(
            errno.EINVAL, f"{path}: not a regular file (a checkpoint holds files, folders and links)"
        )
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_fd(fd: int) -> tuple[str, int]:
    """(sha256 hex, bytes) of what is left to read from an open file."""
    sha, size = hashlib.sha256(), 0
    while block := os.read(fd, CHUNK_BYTES):
        sha.update(block)
        size += len(block)
    return sha.hexdigest(), size


def digest_path(path: str | os.PathLike) -> tuple[str, int]:
    """(digest, bytes) of a checkpoint file or folder; OSError when it cannot be read."""
    path = Path(path)
    if path.is_file():
        hexdigest, size = _file_sha256(path)
        return "sha256:" + hexdigest, size
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    manifest, total = hashlib.sha256(), 0
    for parent, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(parent, d))]):
            full = Path(parent) / name
            rel = full.relative_to(path).as_posix()
            if full.is_symlink():
                manifest.update(f"L {rel} {os.readlink(full)}\n".encode())
                continue
            hexdigest, size = _file_sha256(full)
            manifest.update(f"F {rel} {size} {hexdigest}\n".encode())
            total += size
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(parent, d))]
    return "sha256-tree:" + manifest.hexdigest(), total


def job_roots(roots: list[Path], job: str) -> list[Path]:
    """A job's own checkpoint folders: its folder in each of the host's roots."""
    return [Path(root).resolve() / job_token(job) for root in roots]


def path_problem(path: str, roots: list[Path]) -> str:
    """Why a reported checkpoint path must be refused ('' when it lies under one of `roots`,
    a job's own folders)."""
    if not is_file_path(path):
        return ""
    if not os.path.isabs(path):
        return f"{path!r} is not an absolute path"
    real = Path(os.path.realpath(path))
    for root in roots:
        if real == root or root in real.parents:
            return ""
    where = ", ".join(str(r) for r in roots) or "(none: the host has no checkpoint root)"
    return f"{path} lies outside the job's checkpoint folders {where}"
