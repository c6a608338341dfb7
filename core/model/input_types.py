"""The inputs the scheduler decides on: what clients ask (submit, cancel, hold, set_level...),
what hosts report of their jobs' runs (started, checkpoints, safe points, releases,
finishes), ticks, and the operator's policy changes. Each is a tagged msgspec struct; the
`Input` union is what `core.step` takes.
"""

from __future__ import annotations

from typing import Any, Union
import msgspec


SCHEMA_VERSION = 1


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


class NodeHealth(_Input, tag="node_health"):
    """Input from a host: whether its node can take new work (`healthy`), and when not why
    (`reason`, e.g. its disk is almost full). An unhealthy node is cordoned (no new work, its
    running jobs go on), and uncordoned when it reports healthy again, unless an operator
    cordoned it."""

    node: str
    healthy: bool
    reason: str = ""


class CordonNode(_Input, tag="cordon"):
    """Input from an operator: place no new work on `node` (Slurm's drain, Kubernetes'
    cordon): its running jobs keep running and are managed as before. `reason` is told to
    whoever asks why a job waits."""

    node: str
    reason: str
    by: str = ""


class UncordonNode(_Input, tag="uncordon"):
    """Input from an operator: `node` takes new work again, whoever cordoned it."""

    node: str
    by: str = ""


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
    """Input from a user: stop the job for good (queued, running or mid-preemption). `by`
    and `operator` as for a job request (`_JobRequest`): a cancel that names who asks is its
    owner's or an operator's; one that names nobody (tools, files written before `by`) is
    checked only by the sender's identity, as before."""

    job: str
    by: str = ""
    operator: bool = False


class Started(_RunFact, tag="started"):
    """Fact from a host: the job's process is running (after a start or resume request)."""

    job: str
    # Which copy of its checkpoint a resume read (1: the bus's store, 2: the disk of the host
    # that wrote it); 0: not said (a start, or a resume without the SDK).
    restored_copy: int = 0


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
    NodeHealth,
    CordonNode,
    UncordonNode,
]
