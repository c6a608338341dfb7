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

Over 500 lines on purpose: the whole vocabulary sits in one file, so that a tag is seen
to be new before it is added (tags are never reused) and a reader finds every message in
one place.
"""

from __future__ import annotations

import hashlib
import typing
from typing import Any, Union

import msgspec

SCHEMA_VERSION = 1
LEVELS = 8  # 0 (emergency fix) .. 7 (batch exploration)


class _Input(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    t: int = 0
    v: int = SCHEMA_VERSION
    # Client-chosen id, used for deduplication on the bus (Nats-Msg-Id).
    id: str = ""
    # Sequence of the input on XR_IN, stamped by the scheduler; 0 when offline.
    seq: int = 0
    # Who sent it, as the bus authenticated them (`client:<team>:<user>`, `host:<node>`,
    # `job:<job>`, `op:<user>`, `sched:<instance>`): stamped by the scheduler from the
    # XR_IN subject the server let them publish on, never taken from the body; '' offline
    # (replays, simulations, older logs), where core/identity.py checks nothing.
    origin: str = ""


class _RunFact(_Input, kw_only=True):
    """A fact about one run of a job, from its host or the job itself. `attempt` names the
    run: the log position (record n) of the JobStartRequested/JobResumeRequested that
    started it. A fact of an earlier run is refused (`stale_run`); 0 means unfenced (a
    fact from a client that does not know its run, as before runs were fenced)."""

    attempt: int = 0


class NodeUp(_Input, tag="node_up"):
    """Input from a host: the node is up with `gpus` GPUs of `gpu_model` (joins it, or brings it
    back)."""

    node: str
    gpu_model: str
    gpus: int
    # The address the node's jobs reach it at (a gang's MASTER_ADDR); '' when not given.
    advertise_addr: str = ""


class NodeDown(_Input, tag="node_down"):
    """Input: the node is gone (its agent stopped, or it stopped answering); its jobs are
    requeued."""

    node: str
    reason: str = "reported_down"


class Submit(_Input, tag="submit"):
    """Input from a user: a job to schedule at `level` (0 most urgent) with its size, GPU
    models, runtime estimate and checkpoint costs."""

    job: str
    team: str
    user: str
    level: int
    gpus: int
    gpu_models: list[str] = []
    est_runtime_s: float | None = None
    ckpt_interval_s: float | None = None
    ckpt_cost_s: float | None = None
    restore_cost_s: float | None = None
    preemptible: bool = True
    # Job kind for learned runtime estimates; defaults to the job id without a numeric suffix.
    kind: str = ""
    # Free-form command line for the host agent to run (live system).
    command: list[str] = []
    # How often the job reaches a safe point (an iteration boundary), if the submitter knows.
    safe_point_interval_s: float | None = None
    # Slurm's --signal: the signal a job without the SDK gets at a preemption notice
    # ('' : SIGTERM), and how long it has from then to exit before SIGKILL (None: the host's).
    preempt_signal: str = ""
    grace_s: float | None = None


class Cancel(_Input, tag="cancel"):
    """Input from a user: stop the job for good (queued, running or mid-preemption)."""

    job: str


class Started(_RunFact, tag="started"):
    """Fact from a host: the job's process is running (after a start or resume request)."""

    job: str


class CheckpointStarted(_RunFact, tag="checkpoint_started"):
    """Fact from a job: it began writing a checkpoint."""

    job: str


class CheckpointSaved(_RunFact, tag="checkpoint_saved"):
    """Fact from a job: checkpoint `step` is durable (`digest` names its content, `bytes` its
    size)."""

    job: str
    step: int
    digest: str
    bytes: int
    # Where the checkpoint lies (a file or folder the job wrote, or a location in the SDK's
    # store); a resume is told it. '' : the SDK's store, found by digest.
    path: str = ""


class CheckpointFailed(_RunFact, tag="checkpoint_failed"):
    """Fact from a job or host: a checkpoint could not be written, or failed to verify on
    restore (`digest`)."""

    job: str
    reason: str
    # When a restore finds this checkpoint corrupt, the digest that failed to verify.
    digest: str = ""


class SafePoint(_RunFact, tag="safe_point"):
    """Fact from a notified victim: it reached a safe point (an iteration boundary) and stopped
    computing."""

    job: str


class Released(_RunFact, tag="released"):
    """Fact from a victim's host: the job's processes are gone and its GPUs are free."""

    job: str


class Finished(_RunFact, tag="finished"):
    """Fact from a host: the job's process ended (`ok` false when it failed; `exit_code` when
    seen)."""

    job: str
    ok: bool
    # The process's exit status, when the host saw it (None: killed, or an older agent).
    exit_code: int | None = None
    # The run ended because one part of it could not start on its host, or was killed by a
    # signal (not the job's own failure): every part is stopped and the job queues again.
    requeue: bool = False


class _JobRequest(_Input, kw_only=True):
    """A request about one job by a person: its owner (`by` is the job's user) or an
    operator. `operator` is set by whoever vouches for the sender's role (the scheduler,
    from the sender's NATS identity); a client's own claim is worth what its credentials are."""

    job: str
    by: str = ""
    operator: bool = False


class Hold(_JobRequest, tag="hold"):
    """Keep a queued job from being scheduled until `release`."""


class ReleaseHold(_JobRequest, tag="release"):
    """Let a held job be scheduled again, in its place by submit time."""


class Requeue(_JobRequest, tag="requeue"):
    """Stop a running job and queue it again (it resumes from its last checkpoint)."""


class SetLevel(_JobRequest, tag="set_level", kw_only=True):
    """Change a job's level. Its owner may make it less urgent; only an operator may make
    it more urgent."""

    level: int


class Tick(_Input, tag="tick"):
    """Input from the clock: time has passed; run what is due (saga deadlines, aging, a
    scheduling pass)."""


class SetPolicy(_Input, tag="set_policy"):
    """Input from an operator (or the tuner): change these policy parameters from now on."""

    params: dict[str, Any]
    by: str = "operator"
    reason: str = ""


class Feedback(_Input, tag="feedback"):
    """A user's satisfaction with how a job was treated: a score 1 (bad) .. 5 (good), an
    optional comment, attributed to the user who sent it."""

    job: str
    user: str
    score: int
    comment: str = ""


class SchedulerStart(_Input, tag="scheduler_start"):
    """Input from the scheduler itself, the first it steps as leader. Its state was folded
    from the log (a start, a takeover, a re-read after a refused batch), and folding rebuilds
    everything but what placement passes keep from one step to the next without an event:
    the nodes held for blocked jobs, and whether a pass has anything new to try. Recording
    the start lets whoever re-decides the log (`xirang audit --redecide`) forget them at the
    same point, so a log with any number of leader changes still re-decides exactly."""

    instance: str = ""


class DisownRecord(_Input, tag="disown_record"):
    """Input from the scheduler itself (or an operator): the message at `log_seq` on XR_EV
    is not one of the scheduler's records (no trusted signature covers it, it does not
    follow the hash chain, or it is not a record at all), so every reader passes over it.
    XR_EV denies delete, so the message stays; this records, signed, that it was seen and
    disowned. `digest` is the SHA-256 of the message's bytes (it names the message in an
    exported copy, where positions are lines); `reason` a stable code, `problem` in words."""

    log_seq: int
    digest: str
    reason: str
    problem: str = ""


class Malformed(_Input, tag="malformed"):
    """Not sent by anyone: a line that failed to decode, carried into the machine so that
    its rejection is recorded like any other."""

    raw: str
    error: str
    # Why it was refused, when the bytes were refused before decoding (core/model/bounds.py).
    reason: str = "malformed_input"


Input = Union[
    NodeUp,
    NodeDown,
    Submit,
    Cancel,
    Started,
    CheckpointStarted,
    CheckpointSaved,
    CheckpointFailed,
    SafePoint,
    Released,
    Finished,
    Tick,
    SetPolicy,
    Malformed,
    Feedback,
    Hold,
    ReleaseHold,
    Requeue,
    SetLevel,
    SchedulerStart,
    DisownRecord,
]


# ---------------------------------------------------------------- events


class Slot(msgspec.Struct, array_like=False, frozen=True):
    """GPUs of one node in a placement."""

    node: str
    gpus: list[int]


class _Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    t: int
    v: int = SCHEMA_VERSION


class InputAccepted(_Event, tag="InputAccepted"):
    """The accepted input itself, first in its batch, so the log carries what was decided on."""

    input: Input


# The reason recorded when `step` raised on an input: the state the scheduler goes on from
# was folded back from the log (core/replay.py `step_guarded`).
INTERNAL_ERROR = "internal_error"


class InputRejected(_Event, tag="InputRejected"):
    """An input was refused and changed nothing else: `reason` is a stable code, `detail` says
    what to fix."""

    reason: str
    detail: str = ""
    input_type: str = ""
    job: str = ""


class NodeJoined(_Event, tag="NodeJoined"):
    """A node is part of the pool with its GPUs (from `node_up`)."""

    node: str
    gpu_model: str
    gpus: int
    addr: str = ""  # where its jobs reach it ('' : not advertised)


class NodeLost(_Event, tag="NodeLost"):
    """A node left the pool; `jobs` held GPUs on it and go back to their queues."""

    node: str
    reason: str
    jobs: list[str]


class JobSubmitted(_Event, tag="JobSubmitted"):
    """A job entered its level's queue (`level` may be below `requested_level` when its team is
    downgraded)."""

    job: str
    team: str
    user: str
    level: int  # level after any downgrade
    requested_level: int
    gpus: int
    gpu_models: list[str]
    kind: str
    est_runtime_s: float
    ckpt_interval_s: float
    ckpt_cost_s: float
    restore_cost_s: float
    preemptible: bool
    command: list[str] = []
    variant: str = ""
    safe_point_interval_s: float = 0.0  # 0: unknown (logs from before)
    preempt_signal: str = ""  # '' : SIGTERM
    grace_s: float = 0.0  # 0: the host's grace time


class ResumePoint(msgspec.Struct, kw_only=True, frozen=True):
    """A checkpoint a resume may start from: its step, digest and where it lies."""

    step: int
    digest: str
    path: str


class JobStartRequested(_Event, tag="JobStartRequested"):
    """Host-directed: start the job from scratch on `placement`. `addrs` are the advertised
    addresses of `nodes` (a gang's rendezvous: the first is its master); `preempt_signal`
    and `grace_s` the job's own preemption contract ('' and 0: the host's)."""

    job: str
    placement: list[Slot]
    nodes: list[str]
    command: list[str] = []
    addrs: list[str] = []
    preempt_signal: str = ""
    grace_s: float = 0.0


class JobResumeRequested(_Event, tag="JobResumeRequested"):
    """Host-directed: start the job on `placement` from checkpoint `ckpt_step` (`ckpt_digest`)."""

    job: str
    placement: list[Slot]
    nodes: list[str]
    ckpt_step: int
    ckpt_digest: str
    reason: str = "requeued"
    command: list[str] = []
    addrs: list[str] = []
    preempt_signal: str = ""
    grace_s: float = 0.0
    # The job's checkpoints that name where they lie, newest first: the first that verifies
    # is resumed from (the one recorded, else the one before it).
    resume_points: list[ResumePoint] = []


class JobRunning(_Event, tag="JobRunning"):
    """The job's host reported it started; it had waited `waited_ms` in the queue."""

    job: str
    waited_ms: int


class JobFinished(_Event, tag="JobFinished"):
    """The job completed after `run_ms` of compute; its GPUs are free."""

    job: str
    run_ms: int
    nodes: list[str] = []


class JobFailed(_Event, tag="JobFailed"):
    """The job ended with an error (`reason`); its GPUs are free and it is not retried."""

    job: str
    run_ms: int
    reason: str
    nodes: list[str] = []


class JobCancelled(_Event, tag="JobCancelled"):
    """The job was cancelled; hosts on `nodes` stop its processes."""

    job: str
    nodes: list[str] = []


class JobRequeued(_Event, tag="JobRequeued"):
    """The job went back to its queue (preempted, its node lost, or requeue requested), with a
    recovery `boost`."""

    job: str
    boost: int
    reason: str
    lost_progress_ms: int
    preempt_count: int


class PriorityAged(_Event, tag="PriorityAged"):
    """The job waited past its level's aging threshold and moved up one level."""

    job: str
    from_level: int
    to_level: int
    waited_ms: int


class PreemptionPlanned(_Event, tag="PreemptionPlanned"):
    """A preemption saga began: `preemptor` will run on `placement` once every victim has
    released, or the saga rolls back at `deadline_t`."""

    saga: str
    preemptor: str
    victims: list[str]
    placement: list[Slot]
    deadline_t: int
    benefit: float
    cost: float
    reason: str
    victim_nodes: list[str] = []
    # Taken back for a team below its fair share (not by priority): counts toward no
    # team's fairness window.
    reclaim: bool = False
    # Whether victims of the preemptor's own team (user) count toward the fairness windows.
    # The scheduler records False: the windows count what a team or user does to others.
    # Logs written before that rule lack the field and fold as they were written.
    own_work_counted: bool = True
    # The cascade this preemption belongs to (1: the preemptor was never displaced) and how
    # many levels below the preemptor its lowest victim is; 0 in logs from before.
    depth: int = 0
    levels_down: int = 0


class VictimNotified(_Event, tag="VictimNotified"):
    """Host-directed: tell the victim's job to reach a safe point, checkpoint and release."""

    saga: str
    job: str
    nodes: list[str]
    deadline_t: int
    checkpoint_needed: bool
    # Why, for whom, and which GPUs (empty in logs from before).
    reason: str = ""
    preemptor: str = ""
    preemptor_level: int = -1
    gpus: list[Slot] = []


class VictimReleased(_Event, tag="VictimReleased"):
    """A victim of the saga let go of its GPUs, losing `lost_progress_ms` since its last
    checkpoint."""

    saga: str
    job: str
    lost_progress_ms: int


class PreemptionCommitted(_Event, tag="PreemptionCommitted"):
    """Every victim released: the preemptor starts on their GPUs and the victims are requeued."""

    saga: str
    preemptor: str
    victims: list[str]


class PreemptionRolledBack(_Event, tag="PreemptionRolledBack"):
    """The saga was undone (`reason`): victims keep or get back their GPUs, and the preemptor
    waits again."""

    saga: str
    reason: str
    preemptor: str = ""
    victims: list[str] = []


class NoticeWithdrawn(_Event, tag="NoticeWithdrawn"):
    """Host-directed: a victim that had not released keeps running."""

    saga: str
    job: str
    nodes: list[str]


class PreemptionDeclined(_Event, tag="PreemptionDeclined"):
    """Why a blocked job did not preempt; recorded when the reason changes."""

    job: str
    reason: str
    benefit: float = 0.0
    cost: float = 0.0


class TeamProtected(_Event, tag="TeamProtected"):
    """The team was preempted often enough in the fairness window: its jobs are not victims
    until `until_t`."""

    team: str
    until_t: int
    preempted_in_window: int


class TeamDowngraded(_Event, tag="TeamDowngraded"):
    """The team preempted others often enough in the fairness window: its new jobs enter a level
    lower until `until_t`."""

    team: str
    until_t: int
    preempting_in_window: int


class JobLevelRestored(_Event, tag="JobLevelRestored"):
    """A queued job entered below its requested level under a team downgrade; the team's
    preemption quota has recovered (or the job has waited the policy's
    `downgraded_wait_max_ms`), so it goes back to the level it asked for."""

    job: str
    level: int
    waited_ms: int


class CompensationGranted(_Event, tag="CompensationGranted"):
    """A job preempted often enough gets compensation (`kind`: quota GPU-hours, a priority boost
    or a fee credit)."""

    job: str
    team: str
    kind: str  # quota_gpu_hours | priority_boost | fee_credit
    amount: float
    preempt_count: int
    user: str = ""  # the job's user (logs from before: "")
    until_t: int = 0  # a quota bonus lasts until then (0: for good, as logs from before)
    lost_progress_ms: int = 0  # all progress the job lost to preemptions, the grant's basis


class CheckpointBegan(_Event, tag="CheckpointBegan"):
    """The job began writing a checkpoint (from `checkpoint_started`)."""

    job: str


class CheckpointRecorded(_Event, tag="CheckpointRecorded"):
    """A checkpoint is durable and holds `progress_ms` of the job's progress; restarts resume
    from it."""

    job: str
    step: int
    digest: str
    bytes: int
    progress_ms: int
    path: str = ""


class CheckpointFailedRecorded(_Event, tag="CheckpointFailedRecorded"):
    """A checkpoint of the job failed (`reason`); its last good one stands."""

    job: str
    reason: str


class CheckpointFallback(_Event, tag="CheckpointFallback"):
    """A checkpoint failed to verify on restore: the job resumes from the one before
    (`to_step`), losing `lost_progress_ms`."""

    job: str
    bad_digest: str
    to_step: int
    to_digest: str
    lost_progress_ms: int


class SafePointReached(_Event, tag="SafePointReached"):
    """A notified victim reached a safe point (from `safe_point`)."""

    job: str


class PolicyChanged(_Event, tag="PolicyChanged"):
    """These policy parameters changed (by whom and why), in force from this event on."""

    params: dict[str, Any]
    by: str
    reason: str = ""


class FeedbackRecorded(_Event, tag="FeedbackRecorded"):
    """A survey answer about a job (`feedback` input); the state keeps nothing of it."""

    job: str
    user: str
    score: int
    comment: str = ""


class JobHeld(_Event, tag="JobHeld"):
    """The queued job is held (`hold`): not scheduled until released."""

    job: str
    by: str


class JobHoldReleased(_Event, tag="JobHoldReleased"):
    """The held job may be scheduled again, in its place by submit time."""

    job: str
    by: str


class JobLevelSet(_Event, tag="JobLevelSet"):
    """The job's level changed from `from_level` to `level` (`set_level`); its owner may make it
    `raisable_by_owner` levels more urgent again without an operator (core/level_requests.py;
    0 in logs written before the owner could take a lowering back)."""

    job: str
    level: int
    from_level: int
    by: str
    raisable_by_owner: int = 0


class JobStopRequested(_Event, tag="JobStopRequested"):
    """Host-directed: stop the job's processes (a requeue follows; nothing is reported)."""

    job: str
    nodes: list[str]
    reason: str


class SchedulerStarted(_Event, tag="SchedulerStarted"):
    """A scheduler instance started leading from a state folded from the log: the placement
    passes' memory between steps (node holds; whether a pass has anything new to try)
    starts afresh from here (`scheduler_start`)."""

    instance: str


class RecordDisowned(_Event, tag="RecordDisowned"):
    """The scheduler disowns the message at XR_EV sequence `log_seq` (SHA-256 `digest` of
    its bytes): not one of its records; readers pass over it (see `DisownRecord`). Changes
    no state: the log and its audit keep the account."""

    log_seq: int
    digest: str
    reason: str
    problem: str = ""


class StateDigest(_Event, tag="StateDigest"):
    """The state's digest after record `events`; `schema` says how it was computed (see
    core/log/digest.py): 1 for every digest written before schemas existed (no key)."""

    digest: str
    events: int
    schema: int = 1


Event = Union[
    InputAccepted,
    InputRejected,
    NodeJoined,
    NodeLost,
    JobSubmitted,
    JobStartRequested,
    JobResumeRequested,
    JobRunning,
    JobFinished,
    JobFailed,
    JobCancelled,
    JobRequeued,
    PriorityAged,
    PreemptionPlanned,
    VictimNotified,
    VictimReleased,
    PreemptionCommitted,
    PreemptionRolledBack,
    NoticeWithdrawn,
    PreemptionDeclined,
    TeamProtected,
    TeamDowngraded,
    CompensationGranted,
    CheckpointBegan,
    CheckpointRecorded,
    CheckpointFailedRecorded,
    CheckpointFallback,
    SafePointReached,
    PolicyChanged,
    StateDigest,
    JobLevelRestored,
    FeedbackRecorded,
    JobHeld,
    JobHoldReleased,
    JobLevelSet,
    JobStopRequested,
    SchedulerStarted,
    RecordDisowned,
]


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
