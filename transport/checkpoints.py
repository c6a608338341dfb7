"""Job checkpoints on JetStream, each job's under subjects of its own, so that NATS
permissions keep a job to its own checkpoints (its short-lived credentials allow
`xr.ckpt.<job>.>` and direct gets of those subjects, nothing else).

The stream XR_CKPT (made by the scheduler, like every stream) keeps one message per
subject, the newest:
- `xr.ckpt.<job>.<slot>.<i>`: chunk i of the checkpoint in slot `slot` (a job keeps a
  few slots and reuses the oldest: no job may delete or purge, the stream drops the old
  message when a subject is written again);
- `xr.ckpt.<job>.<slot>.meta`: {chunks, bytes, sha256}, written after the chunks, so a
  write cut short reads as missing (its digest fails), never as a mix;
- `xr.ckpt.<job>.index`: the job's own (sealed) list of its checkpoints.
Reads are direct gets of the last message on a subject (`$JS.API.DIRECT.GET.XR_CKPT.<subject>`).
`<job>` is the job's name as one subject token (trust.natsauth.job_token, one to one).
"""

from __future__ import annotations

import hashlib
import json

from nats.js import api
from nats.js.errors import NotFoundError

from trust.natsauth import CKPT_PREFIX, CKPT_STREAM, job_token

CHUNK_BYTES = 512 * 1024


def stream_config(replicas: int) -> api.StreamConfig:
    """The XR_CKPT stream: one message per subject, direct gets allowed."""
    return api.StreamConfig(
        name=CKPT_STREAM,
        subjects=[f"{CKPT_PREFIX}.>"],
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS,
        max_msgs_per_subject=1,
        discard=api.DiscardPolicy.OLD,
        allow_direct=True,
        num_replicas=replicas,
    )


def subject(job: str, *parts: object) -> str:
    """The subject of a job's checkpoint part: `xr.ckpt.<job token>.<parts...>`."""
    return ".".join([CKPT_PREFIX, job_token(job), *(str(p) for p in parts)])


async def _last(js, subj: str) -> bytes | None:
    try:
        msg = await js.get_msg(CKPT_STREAM, subject=subj, direct=True)
    except NotFoundError:
        return None
    return bytes(msg.data or b"")


async def put(js, job: str, slot: int, data: bytes) -> None:
    """Store `data` as the job's checkpoint in `slot`: the chunks, then the meta."""
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
    for i, chunk in enumerate(chunks):
        await js.publish(subject(job, slot, i), chunk)
    meta = {"chunks": len(chunks), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    await js.publish(subject(job, slot, "meta"), json.dumps(meta).encode())


async def get(js, job: str, slot: int) -> bytes | None:
    """The checkpoint in `slot`, or None when it is missing or incomplete."""
    raw = await _last(js, subject(job, slot, "meta"))
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
        count, digest = int(meta["chunks"]), meta["sha256"]
    except (ValueError, KeyError, TypeError):
        return None
    parts = []
    for i in range(count):
        chunk = await _last(js, subject(job, slot, i))
        if chunk is None:
            return None
        parts.append(chunk)
    data = b"".join(parts)
    return data if hashlib.sha256(data).hexdigest() == digest else None


async def put_index(js, job: str, data: bytes) -> None:
    """Store the job's (sealed) checkpoint index."""
    await js.publish(subject(job, "index"), data)


async def get_index(js, job: str) -> bytes | None:
    """The job's checkpoint index as stored, or None before its first checkpoint."""
    return await _last(js, subject(job, "index"))
