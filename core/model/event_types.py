"""The events the scheduler records: every change of state is one of these, sealed into the
hash chain and applied by `evolve`. Each is a tagged msgspec struct; the `Event` union is
what a `Record` carries. A field added later needs a default, so that older logs decode.
"""

from __future__ import annotations

from typing import Any, Union
import msgspec

from .event_base import OUTPUT_CAP_UNSET, ResumePoint, Slot, _Event
from .input_types import Input


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


class NodeCordoned(_Event, tag="NodeCordoned"):
    """No new work is placed on the node, nor are preemption victims or reservations chosen
    there, until `NodeUncordoned`; its running jobs go on. `by`: `host:<node>` when the node
    reported itself unhealthy, `op:<user>` when an operator cordoned it."""

    node: str
    by: str
    reason: str


class NodeUncordoned(_Event, tag="NodeUncordoned"):
    """The node takes new work again (`by` as for `NodeCordoned`)."""

    node: str
    by: str


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
    # The policy's cap on the output each part keeps on its host (`job_output_max_mb`):
    # absent while the policy sets none, so logs from before read the same.
    output_max_bytes: int | msgspec.UnsetType = OUTPUT_CAP_UNSET
    ckpt_copies: int = 1  # verified copies an SDK checkpoint needs to count as saved


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
    output_max_bytes: int | msgspec.UnsetType = OUTPUT_CAP_UNSET  # as JobStartRequested's
    ckpt_copies: int = 1  # verified copies an SDK checkpoint needs to count as saved


class JobRunning(_Event, tag="JobRunning"):
    """The job's host reported it started; it had waited `waited_ms` in the queue. A resume
    says which copy of its checkpoint it read (`restored_copy`, 0: not said; see `Started`)."""

    job: str
    waited_ms: int
    restored_copy: int | msgspec.UnsetType = msgspec.UNSET


def copy_said(copy: int) -> int | msgspec.UnsetType:
    """A resume's copy number as `JobRunning` records it: left out of its bytes when unsaid."""
    return copy or msgspec.UNSET


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
    regret_max: float | msgspec.UnsetType = msgspec.UNSET  # core/passes/bounded.py; UNSET: 0


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


class NoticeOverdue(_Event, tag="NoticeOverdue"):
    """A victim still held its GPUs at its saga's deadline (the saga rolls back next). Should
    it let go all the same, it counts as preempted (`late_release_counts_as_preemption`)."""

    saga: str
    job: str
    deadline_t: int


class VictimReleasedLate(_Event, tag="VictimReleasedLate"):
    """A victim let go after its saga's deadline, the saga already rolled back: it was
    preempted all the same, and is counted (preemption count, boost, compensation) as one."""

    saga: str
    job: str
    lost_progress_ms: int


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
    NoticeOverdue,
    VictimReleasedLate,
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
    NodeCordoned,
    NodeUncordoned,
]
