"""Job checkpoints on JetStream, each job's under subjects of its own, so that NATS
permissions keep a job to its own checkpoints: a job run's short-lived credentials allow
writing `xr.ckpt.<job>.<its node>.>` and direct gets of `xr.ckpt.<job>.>`, nothing else
(a job resumed on another node reads what it wrote on the first).

The stream XR_CKPT (made by the scheduler, like every stream) keeps one message per
subject, the newest:
- `xr.ckpt.<job>.<node>.<slot>.<i>`: chunk i of the checkpoint in slot `slot` written on
  `node`; the SDK names a slot `<run>-<k>`, so a run writes only in slots of its own, and
  the log records where each checkpoint lies (agents/sdk.py says when a slot is reused: no
  job may delete or purge, the stream drops the old message when a subject is written
  again);
- `xr.ckpt.<job>.<node>.<slot>.meta`: {chunks, bytes, sha256}, written after the chunks,
  so a write cut short reads as missing (its digest fails), never as a mix;
- `xr.ckpt.<job>.<node>.index`: the job's own (sealed) list of its checkpoints; the newest
  over all nodes is the one read.
Reads are direct gets of the last message on a subject, or on `*` for the node: the
newest written on any node (`$JS.API.DIRECT.GET.XR_CKPT.<subject>`). `<job>` is the job's
name as one subject token (trust.natsauth.job_token, one to one), `<node>` the node's
(trust.natsauth.bus_node_token).
"""

from __future__ import annotations

import hashlib
import json

from nats.js import api
from nats.js.errors import NotFoundError

from core.identity import name_of_token
from trust.natsauth import CKPT_PREFIX, CKPT_STREAM, bus_node_token, job_token

CHUNK_BYTES = 512 * 1024
ANY_NODE = "*"


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


def subject(job: str, node: str, *parts: object) -> str:
    """The subject of a job's checkpoint part written on `node` (ANY_NODE: on any)."""
    node_part = node if node == ANY_NODE else bus_node_token(node)
    return ".".join([CKPT_PREFIX, job_token(job), node_part, *(str(p) for p in parts)])


async def _last(js, subj: str) -> tuple[str, bytes] | None:
    try:
        msg = await js.get_msg(CKPT_STREAM, subject=subj, direct=True)
    except NotFoundError:
        return None
    return msg.subject, bytes(msg.data or b"")


async def put(js, job: str, node: str, slot: int | str, data: bytes) -> None:
    """Store `data` as the job's checkpoint in `slot`, written on `node`: chunks, then meta."""
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
    for i, chunk in enumerate(chunks):
        await js.publish(subject(job, node, slot, i), chunk)
    meta = {"chunks": len(chunks), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    await js.publish(subject(job, node, slot, "meta"), json.dumps(meta).encode())


async def get(js, job: str, slot: int | str, node: str = ANY_NODE) -> bytes | None:
    """The checkpoint in `slot` written on `node` (by default the newest on any node), or
    None when it is missing or incomplete."""
    found = await get_located(js, job, slot, node)
    return None if found is None else found[1]


async def get_located(js, job: str, slot: int | str, node: str = ANY_NODE) -> tuple[str, bytes] | None:
    """(the node token it was written on, the checkpoint) for `slot`, or None."""
    found = await _last(js, subject(job, node, slot, "meta"))
    if found is None:
        return None
    meta_subject, raw = found
    written_on = meta_subject.split(".")[3]
    try:
        meta = json.loads(raw)
        count, digest = int(meta["chunks"]), meta["sha256"]
    except (ValueError, KeyError, TypeError):
        return None
    parts = []
    for i in range(count):
        chunk = await _last(js, ".".join([CKPT_PREFIX, job_token(job), written_on, str(slot), str(i)]))
        if chunk is None:
            return None
        parts.append(chunk[1])
    data = b"".join(parts)
    return (written_on, data) if hashlib.sha256(data).hexdigest() == digest else None


async def put_index(js, job: str, node: str, data: bytes) -> None:
    """Store the job's (sealed) checkpoint index, written on `node`."""
    await js.publish(subject(job, node, "index"), data)


async def get_index(js, job: str) -> bytes | None:
    """The job's newest checkpoint index (written on any node), or None before its first."""
    found = await _last(js, subject(job, ANY_NODE, "index"))
    return None if found is None else found[1]


async def stored_jobs(js) -> list[str]:
    """The jobs that have anything in XR_CKPT, by name, sorted."""
    info = await js.stream_info(CKPT_STREAM, subjects_filter=f"{CKPT_PREFIX}.>")
    at = len(CKPT_PREFIX.split("."))
    tokens = {subj.split(".")[at] for subj in (info.state.subjects or {}) if subj.count(".") > at}
    return sorted(name_of_token(token) for token in tokens)


async def purge_job(js, job: str) -> None:
    """Remove every checkpoint of `job`, on every node (the scheduler's, once it has ended)."""
    await js.purge_stream(CKPT_STREAM, subject=f"{CKPT_PREFIX}.{job_token(job)}.>")
