"""The bus: NATS JetStream streams, subjects and the few operations every agent shares.

- XR_IN (`xr.in.<type>`): inputs from clients, hosts and jobs, deduplicated by the input's
  `id` (Nats-Msg-Id; a uuid is assigned when the client gave none).
- XR_EV (`xr.ev.>`): the log, file storage, kept forever, atomic batches allowed. Every
  record goes to `xr.ev.log.<EventType>`; a record whose event names hosts (`nodes`, or
  `node` for NodeJoined/NodeLost) also goes, same bytes, to `xr.ev.host.<node>.<EventType>`
  in the same atomic batch, so a host agent's durable consumer reads only its own.
  Rebuilding state reads only `xr.ev.log.>`.
- XR_SNAP (object store): the newest state snapshot and the XR_EV sequence it covers.
- XR_CKPT (stream, one message per subject): job checkpoints, each job's under its own
  subjects (transport/checkpoints.py), written and read by the job SDK.
- XR_LEASE (key-value): the scheduler leader lease (compare-and-set on revision).
- `xr.hb.<node>`: host heartbeats, plain NATS (not stored).

Everything is created idempotently by whoever connects first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import uuid
import weakref
from typing import AsyncIterator

import msgspec
import nats
from nats.js import api
from nats.js.errors import BadRequestError, NotFoundError, ObjectNotFoundError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception
from tenacity.wait import wait_exponential, wait_random_exponential

from core import load_snapshot, new_state, snapshot_bytes
from core import types as T
from core.replay import apply_record
from core.identity import sender_tokens
from trust.connect import CredentialsRefused, connect_options, credentials_refused
from . import checkpoints
from core.model.state import DIGEST_SCHEMA, State
from trust.foreign import LogSorter
from trust.signing import sign_records

log = logging.getLogger("xirang.bus")

IN_STREAM = "XR_IN"
EV_STREAM = "XR_EV"
IN_PREFIX = "xr.in"
IDENTITY_ENV = "XIRANG_IDENTITY"
_IDENTITY: dict[str, str] = {}  # the identity of the credentials this process connected with
LOG_PREFIX = "xr.ev.log"
HOST_PREFIX = "xr.ev.host"
HB_PREFIX = "xr.hb"
# Alerts for operators (plain NATS, not stored): `xr.alert.<kind>`, JSON.
ALERT_PREFIX = "xr.alert"
SNAP_BUCKET = "XR_SNAP"
CKPT_STREAM = "XR_CKPT"
LEASE_BUCKET = "XR_LEASE"
SNAP_OBJECT = "latest"
DEDUP_WINDOW_S = 600.0
# The server refuses atomic batches above 1000 messages; leave room for one more input.
BATCH_MESSAGES_MAX = 800
BATCH_ACK_TIMEOUT_S = 10.0
FETCH_BATCH = 1000
WRITER_HEADER = "Xr-Writer"
FENCING_ERR_CODE = 10071
# Foreign messages a fold names one by one in its warnings (the rest are counted).
FOREIGN_NAMED_MAX = 10

_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


class FencingError(RuntimeError):
    """Another writer appended since our last append: our view of the log is stale."""


class LogTruncated(RuntimeError):
    """The log is shorter than a signed snapshot says it was: someone deleted records."""


class BatchError(RuntimeError):
    """The server refused an atomic batch (or did not answer): the outcome must be re-read."""


def node_token(name: str) -> str:
    """A subject token for a node name; names outside [A-Za-z0-9_-] are hex-encoded."""
    if _SAFE_TOKEN.match(name):
        return name
    return "x" + name.encode().hex()


async def connect(
    url: str, name: str = "xirang", creds: str | None = None, **kwargs
) -> tuple[nats.NATS, object]:
    """Connect to one or several servers (comma separated), with the credentials in
    `creds` or $XIRANG_CREDS and TLS as trust/connect.py says. `on_error` (async, optional)
    is told every error the client reports (a slow consumer's dropped messages among them)."""
    refused: list[BaseException] = []
    denied: list[str] = []
    on_error = kwargs.pop("on_error", None)

    async def _quiet(err):  # reconnect noise is handled by the callers' timeouts
        if on_error is not None:
            await on_error(err)
        if "authorization violation" in str(err).lower() or isinstance(err, nats.errors.AuthorizationError):
            refused.append(err)
        permission = PERMISSION_VIOLATION.search(str(err))
        if permission:  # remembered, so that a request the server never answers is explained
            log.warning("%s: %s", name, err)
            denied.append(permission.group(2).lower())
            del denied[:-_DENIED_KEPT]

    options, identity = connect_options(url, creds)
    # The latest connection's: one made without credentials must not send as an earlier one's.
    if identity:
        _IDENTITY["from_creds"] = identity
    else:
        _IDENTITY.pop("from_creds", None)
    connecting = asyncio.ensure_future(
        nats.connect(
            name=name,
            max_reconnect_attempts=kwargs.pop("reconnects", 60),
            reconnect_time_wait=kwargs.pop("reconnect_time_wait", 0.25),
            connect_timeout=5,
            error_cb=_quiet,
            **options,
            **kwargs,
        )
    )
    try:
        # A client told to reconnect forever would also try refused credentials forever:
        # the server saying no several times running is an answer, not an outage.
        while not connecting.done():
            await asyncio.wait({connecting}, timeout=0.1)
            if len(refused) >= CREDENTIALS_REFUSED_TIMES and not connecting.done():
                connecting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await connecting
                raise CredentialsRefused(credentials_refused(creds))
        nc = connecting.result()
    except nats.errors.NoServersError as err:
        if refused:  # the server answered, and said no: not an outage
            raise CredentialsRefused(credentials_refused(creds)) from err
        raise
    except BaseException:
        connecting.cancel()
        raise
    _DENIED[nc] = denied
    return nc, nc.jetstream(timeout=10)


# Long-running processes wait out any outage: they reconnect forever, and a first
# connection that fails is retried with backoff up to this pause between tries.
RECONNECT_WAIT_S = 0.5
CONNECT_BACKOFF_MAX_S = 5.0
# How many refusals of the credentials in a row end a connection attempt that would
# otherwise go on forever (one could be a server still loading its accounts).
CREDENTIALS_REFUSED_TIMES = 3
# The server's words when it will not let this identity publish or subscribe somewhere.
PERMISSION_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "?([^"\s]+)', re.I)
# Connection -> the subjects the server refused it, newest last (a bounded list).
_DENIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DENIED_KEPT = 20


class PermanentBusError(RuntimeError):
    """Retrying cannot help: the server answered, and the answer will not change until
    someone changes the set-up. The message says what to fix."""


def denied_subjects(nc) -> list[str]:
    """The subjects the server refused this connection (lower-case, as the server says them)."""
    return list(_DENIED.get(nc, ())) if nc is not None else []


def permanent_problem(err: BaseException) -> str | None:
    """What to fix when `err` is an answer that retrying will not change (refused
    credentials, a refused permission, a stream this identity may not create); None when an
    outage is the likely cause (no server, a timeout, a dropped connection)."""
    if isinstance(err, (PermanentBusError, CredentialsRefused)):
        return str(err)
    if isinstance(err, nats.errors.AuthorizationError) or "authorization violation" in str(err).lower():
        return credentials_refused()
    match = PERMISSION_VIOLATION.search(str(err))
    if match:
        return (
            f"the NATS server does not let these credentials {match.group(1)} to {match.group(2)}:"
            " use credentials of a role that may (`xirang nats add-user --role ...`), or give the role"
            " that permission"
        )
    return None


def _backoff(first_delay_s: float):
    """Exponential backoff with equal jitter: each wait is half the exponential step plus a
    random part up to the other half, capped at CONNECT_BACKOFF_MAX_S, so that many agents
    that lost the bus together do not come back in lockstep."""
    half = first_delay_s / 2
    return wait_exponential(multiplier=half, max=CONNECT_BACKOFF_MAX_S / 2) + wait_random_exponential(
        multiplier=half, max=CONNECT_BACKOFF_MAX_S / 2
    )


async def connect_forever(url: str, name: str = "xirang", stop=None, **kwargs) -> tuple[nats.NATS, object]:
    """`connect` for the scheduler, agents and jobs: never gives up. The first connection
    is retried with exponential backoff (capped); once connected, the client reconnects
    forever. `stop` (an asyncio.Event) ends the wait with ConnectionError."""
    try:
        return await retry_with_backoff(
            lambda: connect(url, name=name, reconnects=-1, **kwargs),
            f"{name}: reaching NATS at {url}",
            stop,
            first_delay_s=0.1,
        )
    except Exception as err:
        if stop is not None and stop.is_set():
            raise ConnectionError(f"stopped while waiting for NATS at {url}") from err
        raise


async def retry_with_backoff(action, what: str, stop=None, first_delay_s: float = 0.2):
    """`await action()` until it succeeds, waiting between tries with jittered exponential
    backoff capped at CONNECT_BACKOFF_MAX_S: the bus may be away. An error retrying cannot
    help (`permanent_problem`) ends it at once with PermanentBusError saying what to fix.
    Once `stop` (an asyncio.Event) is set, the wait ends at once and the next failure is
    raised."""

    async def pause(delay_s: float) -> None:
        if stop is None:
            await asyncio.sleep(delay_s)
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)

    def report(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        delay_s = state.upcoming_sleep
        log.warning("%s failed (%r); retrying in %.2f s", what, err, delay_s)

    async def attempt():  # `action` may be a plain function returning an awaitable
        return await action()

    retrying = AsyncRetrying(
        retry=retry_if_exception(lambda err: permanent_problem(err) is None),
        wait=_backoff(first_delay_s),
        stop=lambda state: stop is not None and stop.is_set(),
        sleep=pause,
        before_sleep=report,
        reraise=True,
    )
    try:
        return await retrying(attempt)
    except Exception as err:
        problem = permanent_problem(err)
        if problem is None or isinstance(err, PermanentBusError):
            raise
        raise PermanentBusError(f"{what}: {problem}") from err


async def ensure_streams(js, replicas: int | None = None) -> None:
    """Streams and buckets, replicated `replicas` times (default $XIRANG_REPLICAS, else 1)."""
    if replicas is None:
        replicas = int(os.environ.get("XIRANG_REPLICAS", "1"))
    await _ensure_stream(
        js,
        api.StreamConfig(
            name=IN_STREAM,
            subjects=[f"{IN_PREFIX}.>"],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=DEDUP_WINDOW_S,
            num_replicas=replicas,
        ),
    )
    await _ensure_stream(
        js,
        api.StreamConfig(
            name=EV_STREAM,
            subjects=["xr.ev.>"],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            allow_atomic=True,
            deny_delete=True,
            deny_purge=True,
            num_replicas=replicas,
            duplicate_window=DEDUP_WINDOW_S,
        ),
    )
    try:
        await js.object_store(SNAP_BUCKET)
    except (NotFoundError, BadRequestError, Exception):  # noqa: BLE001 - any miss means create
        await _create_object_store(js, SNAP_BUCKET, replicas)
    await _ensure_stream(js, checkpoints.stream_config(replicas))
    try:
        await js.key_value(LEASE_BUCKET)
    except Exception:  # noqa: BLE001
        try:
            await js.create_key_value(api.KeyValueConfig(bucket=LEASE_BUCKET, history=1, replicas=replicas))
        except BadRequestError:
            pass  # created by someone else meanwhile


async def _create_object_store(js, bucket: str, replicas: int) -> None:
    try:
        await js.create_object_store(
            bucket,
            config=api.ObjectStoreConfig(bucket=bucket, storage=api.StorageType.FILE, replicas=replicas),
        )
    except BadRequestError:
        pass


async def _ensure_stream(js, config: api.StreamConfig) -> None:
    try:
        await js.stream_info(config.name)
    except NotFoundError:
        try:
            await js.add_stream(config)
        except BadRequestError as err:
            if "already in use" not in str(err):
                raise
        except nats.errors.TimeoutError as err:
            # The server just said the stream is missing; a create that goes unanswered while
            # the server refused its subject is a permission, not an outage.
            create = f"$js.api.stream.create.{config.name}".lower()
            if create in denied_subjects(getattr(js, "_nc", None)):
                raise PermanentBusError(
                    f"stream {config.name} does not exist and these credentials may not create it:"
                    " start the scheduler first (it creates the streams), or connect once with"
                    " credentials of a role that may"
                ) from err
            raise


# ---------------------------------------------------------------- inputs


# Operators' requests about others' jobs arrive on `xr.in.op.>`: NATS permissions decide
# who may publish there (deploy/nats gives each operator `xr.in.op.<user>.<type>`), and the
# scheduler believes an input's `operator` flag only from the subject.
OPERATOR_PREFIX = f"{IN_PREFIX}.op"


def input_subject(inp: T.Input, sender: str = "") -> str:
    """`xr.in.<sender tokens>.<type>` (see core/identity.py); without a sender (an open,
    embedded server, where nobody is authenticated) `xr.in.op.<type>` for an operator's
    request, else `xr.in.<type>`."""
    if sender:
        return ".".join([IN_PREFIX, *sender_tokens(sender), T.type_name(inp)])
    if getattr(inp, "operator", False):
        return f"{OPERATOR_PREFIX}.{T.type_name(inp)}"
    return f"{IN_PREFIX}.{T.type_name(inp)}"


def vouched(inp: T.Input, subject: str) -> T.Input:
    """The input with its `operator` flag as the subject it came on says, not as it claims:
    an operator's or the scheduler's subject."""
    if not hasattr(inp, "operator"):
        return inp
    operator = subject.startswith(OPERATOR_PREFIX + ".") or subject.startswith(f"{IN_PREFIX}.sched.")
    return inp if inp.operator == operator else msgspec.structs.replace(inp, operator=operator)


def default_sender() -> str:
    """Who this process publishes inputs as: $XIRANG_IDENTITY (`client:<team>:<user>`,
    `op:<user>`), else the identity in its credentials file; the server's permissions
    allow only that one."""
    return os.environ.get(IDENTITY_ENV, "") or _IDENTITY.get("from_creds", "")


async def send_input(js, inp: T.Input, sender: str | None = None) -> tuple[str, int, bool]:
    """Publish one input to XR_IN as `sender` (default $XIRANG_IDENTITY, else the
    credentials' identity); returns (id, XR_IN sequence, duplicate)."""
    if not inp.id:
        inp = msgspec.structs.replace(inp, id=uuid.uuid4().hex)
    if sender is None:
        sender = default_sender()
    ack = await js.publish(input_subject(inp, sender), T.encode(inp), headers={"Nats-Msg-Id": inp.id})
    return inp.id, ack.seq, bool(ack.duplicate)


async def send_raw_input(js, data: bytes, msg_id: str | None = None) -> int:
    """Publish bytes as they are (possibly malformed: the scheduler records the rejection)."""
    ack = await js.publish(f"{IN_PREFIX}.raw", data, headers={"Nats-Msg-Id": msg_id or uuid.uuid4().hex})
    return ack.seq


# ---------------------------------------------------------------- the log


def host_nodes(event: T.Event) -> list[str]:
    """The nodes whose hosts must see this event (its `nodes`, or the node it is about); [] when
    no host acts on it."""
    nodes = getattr(event, "nodes", None)
    if nodes:
        return list(nodes)
    if isinstance(event, (T.NodeJoined, T.NodeLost)):
        return [event.node]
    return []


def record_messages(records: list[T.Record], signer=None) -> list[tuple[str, bytes]]:
    """The log copy of each record, then its host-directed copies (same bytes). With a
    `trust.signing.Signer`, records are signed first (`sign_records` says which)."""
    if signer is not None:
        records = sign_records(records, signer, host_nodes)
    out: list[tuple[str, bytes]] = []
    for record in records:
        data = T.encode_record(record)
        name = T.type_name(record.event)
        out.append((f"{LOG_PREFIX}.{name}", data))
        for node in dict.fromkeys(host_nodes(record.event)):
            out.append((f"{HOST_PREFIX}.{node_token(node)}.{name}", data))
    return out


async def publish_atomic(nc, messages: list[tuple[str, bytes]], expected_last_seq: int, writer: str) -> int:
    """Append messages to XR_EV as one atomic batch fenced by expected-last-sequence.
    Returns the stream sequence of the last message."""
    batch_id = uuid.uuid4().hex
    last = len(messages)
    for i, (subject, data) in enumerate(messages, 1):
        headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i), WRITER_HEADER: writer}
        if i == 1:
            headers["Nats-Expected-Last-Sequence"] = str(expected_last_seq)
        if i < last:
            await nc.publish(subject, data, headers=headers)
            continue
        headers["Nats-Batch-Commit"] = "1"
        try:
            reply = await nc.request(subject, data, headers=headers, timeout=BATCH_ACK_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - timeout or connection loss: outcome unknown
            raise BatchError(f"no answer to atomic batch: {err!r}") from err
        answer = json.loads(reply.data or b"{}")
        error = answer.get("error")
        if error:
            if error.get("err_code") == FENCING_ERR_CODE:
                raise FencingError(error.get("description", "wrong last sequence"))
            raise BatchError(f"atomic batch refused: {error}")
        return int(answer["seq"])
    raise ValueError("empty batch")


async def stream_last_seq(js, stream: str) -> int:
    """The sequence number of the newest message in `stream` (0 when empty)."""
    info = await js.stream_info(stream)
    return info.state.last_seq


async def read_messages(js, start_seq: int, end_seq: int) -> AsyncIterator[tuple[int, bytes]]:
    """The messages on `xr.ev.log.>` with start_seq <= stream seq <= end_seq, in order, as
    stored (whoever wrote them: `trust.foreign.LogSorter` tells the scheduler's apart)."""
    if end_seq < start_seq:
        return
    sub = await js.pull_subscribe(
        f"{LOG_PREFIX}.>",
        durable=None,
        stream=EV_STREAM,
        config=api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0,
            max_ack_pending=-1,
        ),
    )
    try:
        info = await sub.consumer_info()
        pending = info.num_pending
        while pending > 0:
            msgs = await sub.fetch(min(FETCH_BATCH, pending), timeout=10)
            for msg in msgs:
                pending -= 1
                seq = msg.metadata.sequence.stream
                if seq > end_seq:
                    return
                yield seq, msg.data
                if seq == end_seq:
                    return
    finally:
        await sub.unsubscribe()


async def read_records(js, start_seq: int, end_seq: int) -> AsyncIterator[tuple[int, T.Record]]:
    """Records on `xr.ev.log.>` with start_seq <= stream seq <= end_seq, in order, unsorted
    (for tools that look at what is there; folding sorts: `fold_records`)."""
    async for seq, data in read_messages(js, start_seq, end_seq):
        try:
            record = T.decode_record(data)
        except msgspec.DecodeError as err:
            # Only the scheduler's sealed records form the chain: a stray message on the
            # log's subjects is passed over, never folded, never fatal.
            log.warning("log reader: skipping undecodable message at XR_EV seq %d: %s", seq, err)
        else:
            yield seq, record


async def load_state(
    js, snapshot: bool = True, stats: dict | None = None, keyring=None, foreign: list | None = None
) -> tuple[State, int]:
    """State folded from the newest snapshot plus the log tail; returns (state, the XR_EV
    sequence it covers). The policy comes from the log (set_policy inputs), never from a
    local file, so a replay of the log rebuilds the same state. `stats`, if given, gets
    the snapshot's sequence and the number of tail records folded. With a
    `trust.signing.KeyRing`, only a snapshot and records the scheduler signed are trusted
    (`trust.signing.SignatureError` names the first one that is not). Foreign messages
    are passed over and listed in `foreign`, if given (see `fold_records`)."""
    end_seq = await stream_last_seq(js, EV_STREAM)
    state, covered = (await load_snapshot_obj(js, keyring)) if snapshot else (None, 0)
    if state is not None and covered > end_seq and keyring is not None:
        # A snapshot we signed covers records the log no longer has: never rebuild
        # another history over a deleted one.
        raise LogTruncated(
            f"the log ends at XR_EV seq {end_seq} but the scheduler's signed snapshot "
            f"covers seq {covered}: records were deleted; restore the stream"
        )
    if state is None or covered > end_seq:
        state, covered = new_state(), 0
    folded = await fold_records(js, state, covered + 1, end_seq, keyring, foreign)
    if stats is not None:
        stats.update(snapshot_seq=covered, tail_records=folded)
    return state, end_seq


async def fold_records(
    js, state: State, start_seq: int, end_seq: int, keyring=None, foreign: list | None = None
) -> int:
    """Fold the scheduler's records among the log's messages start_seq..end_seq into state:
    with `keyring`, only records a trusted signature covers (`trust.foreign.LogSorter`:
    checked before a record's effect is kept); without, those that follow the hash chain.
    Any other message is passed over, never folded, and listed in `foreign` (a list of
    `trust.foreign.Foreign`, each saying whether a `RecordDisowned` named it yet). Returns
    how many records were folded."""
    c = state.canonical
    sorter = LogSorter(keyring, c.events_n, c.chain)
    folded = 0
    async for seq, data in read_messages(js, start_seq, end_seq):
        for genuine, _ in sorter.feed(seq, data):
            apply_record(state, genuine)
            folded += 1
    sorter.finish()
    if sorter.foreign:
        undisowned = sorter.undisowned()
        for item in undisowned[:FOREIGN_NAMED_MAX]:
            log.warning("log reader: passing over the message at XR_EV seq %d: %s", item.pos, item.problem)
        log.info(
            "log reader: passed over %d foreign messages on the log (%d not disowned yet)",
            len(sorter.foreign),
            len(undisowned),
        )
        if foreign is not None:
            foreign.extend(sorter.foreign)
    return folded


# Snapshots of digest schemas 2 and 3 hold the same state (schema 3 changed only how a
# digest sums the nodes): a release writing schema 3 loads both.
SNAPSHOT_SCHEMA_MIN = 2


async def load_snapshot_obj(js, keyring=None) -> tuple[State | None, int]:
    """The newest snapshot and the XR_EV sequence it covers; with a keyring, only one the
    scheduler sealed (anyone else's is ignored: the log is folded from the start)."""
    try:
        store = await js.object_store(SNAP_BUCKET)
        result = await store.get(SNAP_OBJECT)
    except (ObjectNotFoundError, NotFoundError):
        return None, 0
    except Exception:  # noqa: BLE001 - a missing or unreadable snapshot only costs a longer fold
        return None, 0
    head, _, body = bytes(result.data).partition(b"\n")
    meta = json.loads(head)
    if not SNAPSHOT_SCHEMA_MIN <= meta.get("digest_schema", 1) <= DIGEST_SCHEMA:
        # Written by another release: its state may lack what this one's digests cover
        # (Canonical.policy_params); folding the log from the start rebuilds all of it.
        return None, 0
    if keyring is not None and not keyring.verify_blob(_snapshot_sealed(meta, body), meta.get("seal", {})):
        return None, 0
    return load_snapshot(body), int(meta["ev_seq"])


def _snapshot_sealed(meta: dict, body: bytes) -> bytes:
    return (
        json.dumps({"ev_seq": meta.get("ev_seq"), "events_n": meta.get("events_n")}, sort_keys=True).encode()
        + b"\n"
        + body
    )


def snapshot_payload(state: State, ev_seq: int, signer=None) -> bytes:
    """The state as of log position `ev_seq`, encoded as the snapshot bucket holds it (sealed
    with the scheduler's key when `signer` is given): taken at one point of the loop, put
    whenever (`put_snapshot`)."""
    meta = {"ev_seq": ev_seq, "events_n": state.canonical.events_n, "digest_schema": DIGEST_SCHEMA}
    body = snapshot_bytes(state.canonical)
    if signer is not None:
        meta["seal"] = signer.sign_blob(_snapshot_sealed(meta, body))
    return json.dumps(meta).encode() + b"\n" + body


async def put_snapshot(js, payload: bytes) -> None:
    """Store an encoded snapshot (`snapshot_payload`) as the newest."""
    store = await js.object_store(SNAP_BUCKET)
    await store.put(SNAP_OBJECT, payload)


async def save_snapshot(js, state: State, ev_seq: int, signer=None) -> None:
    """Store the state as of log position `ev_seq` in the snapshot bucket (sealed with the
    scheduler's key when `signer` is given)."""
    await put_snapshot(js, snapshot_payload(state, ev_seq, signer))


async def all_records(js) -> list[tuple[int, T.Record]]:
    """Every record of the log, with its stream sequence, in order."""
    end = await stream_last_seq(js, EV_STREAM)
    return [item async for item in read_records(js, 1, end)]


async def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):
    """Poll an async predicate until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)
