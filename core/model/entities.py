"""The entities of the scheduler's state: nodes and their GPUs, jobs and their checkpoints,
open preemption sagas, fairness windows, learned estimates, the compensation ledger, and
`Canonical`, everything a snapshot stores and a `StateDigest` covers; the job states; and
the small functions of one entity (a job's progress, a window's count).

A field added to an entity needs a default, and must keep it for whatever events written
before it produce, so that older logs keep their state digests (core/log/digest.py says why).
"""

from __future__ import annotations

import bisect
from typing import Any
import msgspec
from .policy import Policy
from .types import GENESIS_HASH, LEVELS, Slot


# Job states
QUEUED = "queued"


STARTING = "starting"  # start or resume requested, waiting for `started`


RUNNING = "running"


RESERVED = "reserved"  # preemptor holding a reservation while its saga runs


PREEMPTING = "preempting"  # victim notified, not yet released


RELEASED = "released"  # victim released inside an open saga


FINISHED = "finished"


FAILED = "failed"


CANCELLED = "cancelled"


HELD = "held"  # queued, but kept out of the queues by a `hold` until `release`


TERMINAL = (FINISHED, FAILED, CANCELLED)


# States in which a job holds GPUs (its placement).
HOLDING = (STARTING, RUNNING, RESERVED, PREEMPTING)


class Checkpoint(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A checkpoint a job saved: step, digest, size, and the progress it holds."""

    step: int
    digest: str
    bytes: int
    progress_ms: int
    t: int
    path: str = ""  # where it lies ('' : found by digest in the SDK's store)
    node: str = ""  # the node whose host reported it ('' : not recorded)


def is_job_written(path: str) -> bool:
    """Whether a checkpoint's location is a file or folder the job wrote (not `xr-ckpt:`)."""
    return bool(path) and not path.startswith("xr-ckpt:")


class Job(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A job the scheduler knows: what was asked, where it is in its life, where it runs, and
    its checkpoints."""

    id: str
    team: str
    user: str
    kind: str
    level: int  # base level: decides what the job may preempt and be preempted by
    requested_level: int
    eff_level: int  # queue level after aging and recovery boost
    gpus: int
    gpu_models: list[str]
    est_runtime_ms: int
    ckpt_interval_ms: int
    ckpt_cost_ms: int
    restore_cost_ms: int
    safe_point_interval_ms: int = 0  # 0: unknown, the victims' learned notice-to-safe-point time holds
    preemptible: bool
    command: list[str] = []
    variant: str = ""
    preempt_signal: str = ""  # '' : SIGTERM
    grace_ms: int = 0  # 0: the host's grace time
    state: str = QUEUED
    submit_t: int = 0
    queued_since_t: int = 0
    level_since_t: int = 0
    placement: list[Slot] = []
    run_started_t: int = 0
    progress_ms: int = 0  # progress banked before the current run
    frozen_t: int = 0  # time the job stopped progressing (safe point); 0 while progressing
    checkpoints: list[Checkpoint] = []
    ckpt_started_t: int = 0
    preempt_count: int = 0
    boost: int = 0
    protected_until_t: int = 0
    saga: str = ""
    last_decline: str = ""
    preempt_retry_t: int = 0  # no new saga for this job before this time
    resume_pending: bool = False
    compensations: int = 0
    first_start_t: int = 0
    # Depth of the preemption cascade that displaced the job, until it runs again (0: none).
    cascade_depth: int = 0
    waited_total_ms: int = 0  # queue wait borne over all its starts (the recovery boost grows with it)
    lost_total_ms: int = 0  # progress lost to every preemption (compensation pays for all of it)
    raisable_by_owner: int = 0  # levels its owner lowered it by and may take back (JobLevelSet)
    # The saga whose deadline passed while the job was still letting go (NoticeOverdue), until
    # it lets go, queues again or is a victim anew: a release then is a late one.
    overdue_saga: str = ""
    # The current run: the record n of the start that began it (facts of other runs are
    # stale). Outside the state digest (job_hash leaves it out), so logs written before
    # runs were fenced keep their digests.
    run: int = 0


class Node(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A host's GPUs: model, count, and which job holds each."""

    name: str
    gpu_model: str
    gpus: int
    holder: list[str]  # job id per GPU index, "" when free
    up: bool = True
    addr: str = ""  # where its jobs reach it (a gang's master address)
    # Who cordoned it ('' : nobody; `host:<node>`, `op:<user>`) and why: while cordoned it
    # takes no new work (core/model/cordon.py), its running jobs go on.
    cordoned_by: str = ""
    cordon_reason: str = ""


class Saga(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An open preemption: preemptor, victims, the placement it reserves, and its deadline."""

    id: str
    preemptor: str
    victims: list[str]
    released: list[str]
    placement: list[Slot]
    deadline_t: int
    planned_t: int
    benefit: float
    cost: float
    # GPUs of released victims outside the preemptor's placement: held for the saga so a
    # rollback can give every victim its whole gang back; freed at commit.
    held_extra: list[Slot] = []
    reclaim: bool = False  # taken back for a team below its fair share, not by priority


class Window(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Times of recent preemptions, for sliding-window fairness counts."""

    preempting: list[int] = []
    preempted: list[int] = []


class Estimate(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A running mean (of runtimes per team and kind, or of safe-point latency) and its sample
    count."""

    samples: int = 0
    mean_ms: float = 0.0


class LevelWait(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A level's recent queueing delay (running mean), which speeds its aging up."""

    samples: int = 0
    mean_ms: float = 0.0


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A team's GPU use at one level, decayed by half every `fair_share_half_life_s`: the
    decayed GPU-milliseconds up to `t` (core/model/usage.py)."""

    gpu_ms: float = 0.0
    t: int = 0


class Ledger(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A team's compensation: quota GPU-hours (lasting and time-limited) and fee credit."""

    quota_gpu_hours: float = 0.0  # bonuses for good (granted by older versions)
    quota_bonus_gpu_hours: float = 0.0  # time-limited bonus, until `quota_bonus_until_t`
    quota_bonus_until_t: int = 0
    fee_credit: float = 0.0
    priority_boosts: int = 0


class Canonical(msgspec.Struct, kw_only=True):
    """Everything a snapshot holds and a StateDigest covers."""

    t: int = 0
    events_n: int = 0
    chain: str = GENESIS_HASH
    last_input_seq: int = 0
    policy: Policy = msgspec.field(default_factory=Policy)
    nodes: dict[str, Node] = {}
    jobs: dict[str, Job] = {}
    sagas: dict[str, Saga] = {}
    saga_count: int = 0
    done_count: int = 0
    done_hash: str = GENESIS_HASH
    done: dict[str, str] = {}  # terminal job id -> final state
    team_windows: dict[str, Window] = {}
    user_windows: dict[str, Window] = {}
    team_protected_until: dict[str, int] = {}
    team_downgraded_until: dict[str, int] = {}
    estimates: dict[str, Estimate] = {}
    # Notice -> safe point, as victims have shown it (their mean).
    safe_point_latency: Estimate = msgspec.field(default_factory=Estimate)
    level_wait: list[LevelWait] = msgspec.field(default_factory=lambda: [LevelWait() for _ in range(LEVELS)])
    rr_last_team: list[str] = msgspec.field(default_factory=lambda: [""] * LEVELS)
    ledger: dict[str, Ledger] = {}
    # "level/team" -> the team's decayed GPU use at that level, kept only while
    # `fair_share_half_life_s` is set (core/model/usage.py).
    usage: dict[str, Usage] = {}
    # Every set_policy param the log has set (merged, as recorded), its first record's
    # `defaults_version` among them: `policy` is that version's defaults with these on top
    # (core/model/policy_defaults.py). A digest covers these, not `policy` (core/log/digest.py).
    policy_params: dict[str, Any] = {}


def node_free_count(node: Node) -> int:
    """Free GPUs on a node."""
    return node.holder.count("")


def queue_key(job: Job) -> tuple[int, int, str]:
    """Order within a level's team queue: a job's own level first, so that jobs aged into a
    level queue behind the jobs that belong there, then submit time, then the id."""
    return (job.level, job.submit_t, job.id)


def job_progress_ms(job: Job, t: int) -> int:
    """Training progress: banked progress plus the current run up to now or the safe point."""
    if job.state not in (RUNNING, PREEMPTING) or job.run_started_t == 0:
        return job.progress_ms
    end = job.frozen_t if job.frozen_t else t
    return job.progress_ms + max(0, end - job.run_started_t)


def last_checkpoint(job: Job) -> Checkpoint | None:
    """The job's newest checkpoint, or None."""
    return job.checkpoints[-1] if job.checkpoints else None


def window_count(times: list[int], t: int, window_ms: int) -> int:
    """How many of `times` fall in the window ending at `t`."""
    start = t - window_ms
    return len(times) - bisect.bisect_right(times, start)
