"""The second copy of an SDK checkpoint: on the disk of the host whose job wrote it, served
to the job's later runs (on any host) by that host's agent over NATS.

Why there: the first copy lies in the bus's store (XR_CKPT), the second on the writing
host's own disk, so each covers the other's loss. An object deleted or corrupted in XR_CKPT
(or the bus's disk lost) is read from the host's copy; the host lost with its node (or a
copy on its disk corrupted) is read from the bus. Only both lost together cost the job its
newest checkpoint (then the one before is restored, as with one copy).

- Layout: `<agent state>/<node>/ckpt-copies/<job as one token>/<object>`, one file per
  object the SDK stores (a manifest `<run>-<k>` or a tensor `<run>-<k>_<i>`), the same
  sealed bytes as on the bus. The job's folder is its own (the agent makes it and hands it
  to the run's user); the folder above is the agent's.
- Written durably (agents' `write_durably`: temporary file, fsync, rename) and read back:
  a copy counts only once the bytes on disk are the bytes meant (`write_verified`).
- Served by the agent on `xr.ckptcopy.<node>.<job>`: a request `{"name", "offset"}` gets
  one reply, a JSON header line (`{"size"}` or `{"error"}`) then at most CHUNK_BYTES of the
  object from `offset`. A job's credentials may ask only under its own job's token, so the
  subject names the asker. The agent opens only plain files named like objects, never
  through a link, never a file with other names (a hard link), so a job cannot make its
  host serve it anything but its own copies. The reader checks every copy against the
  digest the log recorded anyway.
- The same subject serves the second copies of checkpoints jobs write themselves, kept in
  a folder of the agent's (a request `{"copy": <digest hex>, ...}`: agents/pathcopy.py),
  under the same rules: only the asking job's own, never through a link.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import stat
from pathlib import Path

from trust.durable import write_durably
from trust.natsauth import COPY_PREFIX, bus_node_token, job_token

COPIES_DIR = "ckpt-copies"
SUBJECT_PREFIX = COPY_PREFIX
# One reply's data: below the bus's default 1 MB payload limit.
CHUNK_BYTES = 512 * 1024
REQUEST_TIMEOUT_S = 10.0
# What the SDK names its objects: `<run>-<slot>` and `<run>-<slot>_<tensor>`.
OBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")


class CopyError(Exception):
    """A second copy that could not be written, or does not read back as written."""


class CopyUnreachable(Exception):
    """No agent answered for the node that holds a copy (it is restarting, or lost)."""


def job_folder(copies_root: str | os.PathLike, job: str) -> Path:
    """A job's folder of second copies on this host."""
    return Path(copies_root) / job_token(job)


def subject(node: str, job: str) -> str:
    """Where `node`'s agent serves `job`'s second copies."""
    return f"{SUBJECT_PREFIX}.{bus_node_token(node)}.{job_token(job)}"


def _checked_name(name: str) -> str:
    if not OBJECT_NAME.fullmatch(name):
        raise CopyError(f"{name!r} is not a checkpoint object's name")
    return name


def write_verified(folder: str | os.PathLike, name: str, data: bytes) -> None:
    """Store `data` as object `name` in `folder`, durably, and read it back: CopyError when
    it cannot be written or the disk gives back other bytes."""
    path = Path(folder) / _checked_name(name)
    try:
        write_durably(path, data)
        back = read_object(folder, name)
    except OSError as err:
        raise CopyError(f"cannot write the host copy of {name}: {err}") from err
    if back is None or hashlib.sha256(back).digest() != hashlib.sha256(data).digest():
        raise CopyError(f"the host copy of {name} does not read back as written")


def _open_object(folder: str | os.PathLike, name: str) -> int | None:
    """A read-only descriptor of object `name` (None: there is none), opened only if it is a
    plain file with one name, reached without following a link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(Path(folder) / _checked_name(name), flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise CopyError(f"{name} is not a plain file of its own")
    return fd


def read_object(folder: str | os.PathLike, name: str) -> bytes | None:
    """The whole object (None: no such copy)."""
    fd = _open_object(folder, name)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_chunk(folder: str | os.PathLike, name: str, offset: int) -> tuple[int, bytes] | None:
    """(the object's size, at most CHUNK_BYTES of it from `offset`), or None."""
    fd = _open_object(folder, name)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, offset))
        return size, fh.read(CHUNK_BYTES)


def reply_for(
    copies_root: str | os.PathLike, job_tok: str, request: bytes, paths_root: str | os.PathLike | None = None
) -> bytes:
    """The agent's answer to one request for a chunk of a job's copy (see the module)."""
    try:
        asked = json.loads(request)
        if isinstance(asked, dict) and "copy" in asked and paths_root is not None:
            from . import pathcopy

            return pathcopy.reply_for(paths_root, job_tok, asked)
        name, offset = str(asked["name"]), int(asked.get("offset", 0))
        found = read_chunk(Path(copies_root) / job_tok, name, offset)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return json.dumps({"error": f"a request is {{name, offset}}: {err}"}).encode() + b"\n"
    except (CopyError, OSError) as err:
        return json.dumps({"error": str(err)}).encode() + b"\n"
    if found is None:
        return json.dumps({"error": "missing"}).encode() + b"\n"
    size, data = found
    return json.dumps({"size": size}).encode() + b"\n" + data


async def serve(nc, node: str, copies_root: str | os.PathLike, paths_root: str | os.PathLike | None = None):
    """Answer requests for this node's jobs' second copies (returns the subscription)."""

    async def answer(msg) -> None:
        job_tok = msg.subject.rsplit(".", 1)[-1]
        data = await asyncio.to_thread(reply_for, copies_root, job_tok, msg.data, paths_root)
        await msg.respond(data)

    return await nc.subscribe(f"{SUBJECT_PREFIX}.{bus_node_token(node)}.*", cb=answer)


async def fetch(nc, node: str, job: str, name: str) -> bytes | None:
    """The whole of `job`'s copy of object `name` from `node`'s agent, or None when it has
    none (the object is missing or unreadable); CopyUnreachable when no agent answers."""
    parts: list[bytes] = []
    got, size = 0, None
    while size is None or got < size:
        request = json.dumps({"name": name, "offset": got}).encode()
        try:
            reply = await nc.request(subject(node, job), request, timeout=REQUEST_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - no agent there (restarting, its node lost), a timeout
            raise CopyUnreachable(f"no agent of {node} answers ({type(err).__name__})") from err
        head, _, data = bytes(reply.data).partition(b"\n")
        try:
            header = json.loads(head)
            size = int(header["size"])
        except (ValueError, KeyError, TypeError):
            return None  # {"error": ...}: missing or refused
        if not data and got < size:
            return None  # the file shrank while read
        parts.append(data)
        got += len(data)
    return b"".join(parts)
