"""The public vocabulary of xirang: inputs (what clients and agents send) and events (what
the scheduler records), as msgspec tagged unions with JSON on the wire.

Inputs are snake_case tagged (`{"type": "submit", ...}`), events PascalCase. Every message
carries `v` (schema version) and `t` (integer milliseconds). Tags are never reused; new
fields are optional so that old logs keep decoding.

An event is sealed into a `Record` by the state machine: its position `n`, the hash of the
previous record and its own hash (SHA-256 over the previous hash and the canonical event
bytes), which makes the log a hash chain an auditor can verify. A reader checks it over the
event's bytes as they were stored (`decode_record`, `content_matches`), never re-encoded:
an event written before its type gained a field keeps its hash.

The inputs are in core/model/input_types.py, the events in core/model/event_types.py;
this module gathers both into one namespace (`types.Submit`, `types.JobSubmitted`) and holds
the records, their encoding and the hash chain. Tags are never reused: look in both files
before adding one.
"""

from __future__ import annotations

import hashlib
import typing
from typing import Any

import msgspec

from .input_types import (  # the vocabulary is read as one namespace: `types.Submit`
    SCHEMA_VERSION as SCHEMA_VERSION,
    _Input as _Input,
    _RunFact as _RunFact,
    NodeUp as NodeUp,
    NodeDown as NodeDown,
    Submit as Submit,
    Cancel as Cancel,
    Started as Started,
    CheckpointStarted as CheckpointStarted,
    CheckpointSaved as CheckpointSaved,
    CheckpointFailed as CheckpointFailed,
    SafePoint as SafePoint,
    Released as Released,
    Finished as Finished,
    _JobRequest as _JobRequest,
    Hold as Hold,
    ReleaseHold as ReleaseHold,
    Requeue as Requeue,
    SetLevel as SetLevel,
    Tick as Tick,
    SetPolicy as SetPolicy,
    Feedback as Feedback,
    SchedulerStart as SchedulerStart,
    DisownRecord as DisownRecord,
    NodeHealth as NodeHealth,
    CordonNode as CordonNode,
    UncordonNode as UncordonNode,
    Malformed as Malformed,
    Input as Input,
)
from .event_types import (  # the vocabulary is read as one namespace: `types.Submit`
    Slot as Slot,
    _Event as _Event,
    InputAccepted as InputAccepted,
    INTERNAL_ERROR as INTERNAL_ERROR,
    InputRejected as InputRejected,
    NodeJoined as NodeJoined,
    NodeLost as NodeLost,
    JobSubmitted as JobSubmitted,
    ResumePoint as ResumePoint,
    JobStartRequested as JobStartRequested,
    JobResumeRequested as JobResumeRequested,
    JobRunning as JobRunning,
    JobFinished as JobFinished,
    JobFailed as JobFailed,
    JobCancelled as JobCancelled,
    JobRequeued as JobRequeued,
    PriorityAged as PriorityAged,
    PreemptionPlanned as PreemptionPlanned,
    VictimNotified as VictimNotified,
    VictimReleased as VictimReleased,
    PreemptionCommitted as PreemptionCommitted,
    PreemptionRolledBack as PreemptionRolledBack,
    NoticeWithdrawn as NoticeWithdrawn,
    NoticeOverdue as NoticeOverdue,
    VictimReleasedLate as VictimReleasedLate,
    PreemptionDeclined as PreemptionDeclined,
    TeamProtected as TeamProtected,
    TeamDowngraded as TeamDowngraded,
    JobLevelRestored as JobLevelRestored,
    CompensationGranted as CompensationGranted,
    CheckpointBegan as CheckpointBegan,
    CheckpointRecorded as CheckpointRecorded,
    CheckpointFailedRecorded as CheckpointFailedRecorded,
    CheckpointFallback as CheckpointFallback,
    SafePointReached as SafePointReached,
    PolicyChanged as PolicyChanged,
    FeedbackRecorded as FeedbackRecorded,
    JobHeld as JobHeld,
    JobHoldReleased as JobHoldReleased,
    JobLevelSet as JobLevelSet,
    JobStopRequested as JobStopRequested,
    SchedulerStarted as SchedulerStarted,
    RecordDisowned as RecordDisowned,
    NodeCordoned as NodeCordoned,
    NodeUncordoned as NodeUncordoned,
    StateDigest as StateDigest,
    Event as Event,
)

LEVELS = 8  # 0 (emergency fix) .. 7 (batch exploration)


# ---------------------------------------------------------------- events


class Record(msgspec.Struct, kw_only=True, omit_defaults=True, dict=True):
    """One sealed event of the log: position, hash chain, and the input it came from.
    `key` and `sig` are the scheduler's Ed25519 signature (see trust/signing.py), added
    outside the core; the chain hash does not cover them.

    A record read back with `decode_record` remembers its event's bytes as stored (not a
    field: never encoded); its hash is checked against those (`content_matches`), so a
    field added to an event type later, with its default, never breaks an older chain."""

    n: int
    prev: str
    hash: str
    input_seq: int = 0
    event: Event
    key: str = ""
    sig: str = ""


GENESIS_HASH = "0" * 64


class _StoredRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A record as stored, its event left as the bytes that were written."""

    n: int
    prev: str
    hash: str
    input_seq: int = 0
    event: msgspec.Raw
    key: str = ""
    sig: str = ""


_input_decoder = msgspec.json.Decoder(Input)
_stored_record_decoder = msgspec.json.Decoder(_StoredRecord)
_event_decoder = msgspec.json.Decoder(Event)
_encoder = msgspec.json.Encoder(order="sorted")


def encode(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, so equal values give equal bytes."""
    return _encoder.encode(obj)


def decode_record(data: bytes | str) -> Record:
    """A record from its stored JSON; it keeps its event's bytes as written (see `Record`)."""
    stored = _stored_record_decoder.decode(data)
    raw = bytes(stored.event)
    record = Record(
        n=stored.n,
        prev=stored.prev,
        hash=stored.hash,
        input_seq=stored.input_seq,
        event=_event_decoder.decode(raw),
        key=stored.key,
        sig=stored.sig,
    )
    record._stored_event = (record.event, raw)  # type: ignore[attr-defined]  # Record has dict=True
    return record


def stored_event(record: Record) -> bytes | None:
    """The record's event bytes as they were read (`decode_record`), or None for a record
    built in memory or whose event was replaced since."""
    stored = getattr(record, "_stored_event", None)
    return stored[1] if stored is not None and stored[0] is record.event else None


def keep_stored_event(source: Record, copy: Record) -> Record:
    """`copy` (of `source`, say with a signature added) keeps the event bytes `source` was
    read with, if it has the same event."""
    raw = stored_event(source)
    if raw is not None and copy.event is source.event:
        copy._stored_event = (copy.event, raw)  # type: ignore[attr-defined]
    return copy


def encode_record(record: Record) -> bytes:
    """A record's JSON line for a log. A record read from a log keeps its event's bytes as
    they were stored (re-encoding an older event would add the fields its type has gained
    since, and break its hash); one built in memory is `encode(record)`."""
    raw = stored_event(record)
    if raw is None:
        return _encoder.encode(record)
    return _encoder.encode(
        _StoredRecord(
            n=record.n,
            prev=record.prev,
            hash=record.hash,
            input_seq=record.input_seq,
            event=msgspec.Raw(raw),
            key=record.key,
            sig=record.sig,
        )
    )


def chain_hash(prev: str, event_bytes: bytes) -> str:
    """A record's hash: SHA-256 over the previous record's hash and its event's canonical
    bytes (`encode`: sorted keys, no spaces). The format of every log so far."""
    return hashlib.sha256(prev.encode() + event_bytes).hexdigest()


def content_matches(record: Record) -> bool:
    """Whether the record's hash covers its event and `prev`. A record read with
    `decode_record` is checked over its event exactly as stored (the keys it had when it was
    written, whatever fields its type has gained since); if the stored bytes are not in
    canonical form (spaces, key order: re-written by some other JSON tool), over the same
    keys and values put back into canonical form. A record built in memory (by `step`) is
    checked over `encode(event)`."""
    raw = stored_event(record)
    if raw is None:  # built here, or its event replaced
        return chain_hash(record.prev, encode(record.event)) == record.hash
    if chain_hash(record.prev, raw) == record.hash:
        return True
    try:
        canonical = _encoder.encode(msgspec.json.decode(raw))
    except msgspec.DecodeError:
        return False
    return canonical != raw and chain_hash(record.prev, canonical) == record.hash


def decode_event(data: bytes | str) -> Event:
    """An event from its JSON bytes."""
    return _event_decoder.decode(data)


def parse_input(data: bytes | str) -> Input:
    """Decode one input line. Never raises: a line that does not decode becomes `Malformed`,
    which the machine turns into `InputRejected` with the decoder's words."""
    from .bounds import raw_problem  # bounds are checked before anything is decoded

    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    problem = raw_problem(data)
    if problem:
        return Malformed(raw=text[:200], error=problem[1], reason=problem[0])
    try:
        return _input_decoder.decode(text)
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError
        return Malformed(raw=text[:2000], error=str(err), t=_best_effort_t(text))


def _best_effort_t(text: str) -> int:
    try:
        obj = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return 0
    t = obj.get("t") if isinstance(obj, dict) else None
    return t if isinstance(t, int) and not isinstance(t, bool) else 0


def normalized(inp: Input) -> Input:
    """The input as it will read back from the log: built in code, a float field may hold
    an int (20 rather than 20.0), which would encode differently after a round trip and
    break the hash chain on audit."""
    if isinstance(inp, Malformed):
        return inp
    kinds = _PLAIN_INPUT_KINDS.get(type(inp))
    if kinds is not None and tuple(map(type, msgspec.structs.astuple(inp))) == kinds:
        return inp  # reads back as it is: spare the round trip (most inputs are facts)
    return _input_decoder.decode(_encoder.encode(inp))


def _plain_kinds(cls: type) -> tuple[type, ...] | None:
    """The type of each field (in order) of an input type whose fields are all plain ints,
    strings and booleans (no floats, lists or constraints), else None: an input of such a
    type whose every value is of exactly its field's type reads back from JSON equal to
    itself."""
    kinds = tuple(field.type for field in msgspec.structs.fields(cls))
    return kinds if all(kind in (int, str, bool) for kind in kinds) else None


_PLAIN_INPUT_KINDS = {
    cls: kinds for cls in typing.get_args(Input) if (kinds := _plain_kinds(cls)) is not None
}


def input_job(inp: Input) -> str:
    """The job an input is about, or '' when it names none."""
    return getattr(inp, "job", "")


def type_name(obj: Any) -> str:
    """The wire tag of an input or event (`submit`, `JobSubmitted`...)."""
    return obj.__struct_config__.tag
