"""How events change jobs: submitted, started, running, ended, requeued, held, their level
set or aged, and their checkpoints and safe points (handlers of `core.log.evolve`). Each
trusts its event: checks belong to the decision that emitted it.
"""

from __future__ import annotations

import hashlib
import typing
from ..model import types as T
from ..model.state import State, hold_add, hold_remove, queue_add, queue_remove, set_holder
from ..model.scratch import forget_release_lists, forget_releases
from ..model.entities import (
    is_job_written,
    FINISHED,
    HELD,
    HOLDING,
    PREEMPTING,
    QUEUED,
    RELEASED,
    RUNNING,
    STARTING,
    Checkpoint,
    Job,
    LevelWait,
    Estimate,
)

LEVEL_WAIT_HORIZON = 100  # samples in the running mean of a level's wait


def submitted_costs_ms(ev: T.JobSubmitted) -> dict[str, int]:
    """A submitted job's runtime estimate and checkpoint costs in whole ms, as a Job keeps them
    (the seconds of the submit, truncated); the test world's simulated hosts run it by them too."""
    return {
        "est_runtime_ms": int(ev.est_runtime_s * 1000),
        "ckpt_interval_ms": int(ev.ckpt_interval_s * 1000),
        "ckpt_cost_ms": int(ev.ckpt_cost_s * 1000),
        "restore_cost_ms": int(ev.restore_cost_s * 1000),
    }


def _job_submitted(s: State, ev: T.JobSubmitted) -> None:
    job = Job(
        id=ev.job,
        team=ev.team,
        user=ev.user,
        kind=ev.kind,
        level=ev.level,
        requested_level=ev.requested_level,
        eff_level=ev.level,
        gpus=ev.gpus,
        gpu_models=list(ev.gpu_models),
        **submitted_costs_ms(ev),  # type: ignore[arg-type]  # the four *_ms ints
        preemptible=ev.preemptible,
        safe_point_interval_ms=int(ev.safe_point_interval_s * 1000),
        command=list(ev.command),
        variant=ev.variant,
        preempt_signal=ev.preempt_signal,
        grace_ms=int(ev.grace_s * 1000),
        submit_t=ev.t,
        queued_since_t=ev.t,
        level_since_t=ev.t,
    )
    s.canonical.jobs[job.id] = job
    queue_add(s.index, s.scratch, job, s.canonical.policy.aging_levels_max)


def _occupy(s: State, job: Job, placement: list[T.Slot]) -> None:
    for slot in placement:
        for gpu in slot.gpus:
            set_holder(s.canonical, s.index, s.scratch, slot.node, gpu, job.id)
        s.index.jobs_by_node.setdefault(slot.node, {})[job.id] = None
    forget_releases(s.scratch, placement)


def _free_slots(s: State, slots: list[T.Slot], holder: str) -> None:
    """Free the GPUs of these slots that `holder` still holds."""
    for slot in slots:
        node = s.canonical.nodes[slot.node]
        for gpu in slot.gpus:
            if node.holder[gpu] == holder:
                set_holder(s.canonical, s.index, s.scratch, slot.node, gpu, "")


def _vacate(s: State, job: Job) -> None:
    _free_slots(s, job.placement, job.id)
    for slot in job.placement:
        on_node = s.index.jobs_by_node.get(slot.node)
        if on_node is not None:
            on_node.pop(job.id, None)
    forget_releases(s.scratch, job.placement)


def _start_requested(s: State, ev: T.JobStartRequested | T.JobResumeRequested) -> None:
    job = s.canonical.jobs[ev.job]
    if job.state == QUEUED:
        queue_remove(s.index, s.scratch, job)
        hold_add(s.index, job)
        s.canonical.rr_last_team[job.eff_level] = job.team
    elif job.state == RELEASED:  # a rolled-back victim gets its GPUs back
        hold_add(s.index, job)
        # It did not queue: its wait to this start begins now, not when it last queued.
        job.queued_since_t = ev.t
    job.state = STARTING
    job.placement = list(ev.placement)
    job.saga = ""
    job.run = s.canonical.events_n + 1  # this start's own record n: the run's fencing token
    _occupy(s, job, job.placement)


def _job_running(s: State, ev: T.JobRunning) -> None:
    job = s.canonical.jobs[ev.job]
    job.state = RUNNING
    job.run_started_t = ev.t
    job.frozen_t = 0
    job.resume_pending = False
    if job.first_start_t == 0:
        job.first_start_t = ev.t
    job.cascade_depth = 0  # it runs again: the cascade that displaced it is over
    job.waited_total_ms += ev.waited_ms
    if job.preempt_count:
        p = s.canonical.policy
        job.protected_until_t = ev.t + min(
            p.restart_protect_max_ms, p.min_run_after_restart_ms * job.preempt_count
        )
    wait = s.canonical.level_wait[job.level]
    samples = min(wait.samples + 1, LEVEL_WAIT_HORIZON)
    s.canonical.level_wait[job.level] = LevelWait(
        samples=wait.samples + 1, mean_ms=wait.mean_ms + (ev.waited_ms - wait.mean_ms) / samples
    )


def _job_ended(s: State, ev: T.JobFinished | T.JobFailed | T.JobCancelled) -> None:
    job = s.canonical.jobs.pop(ev.job)
    if job.state == QUEUED:
        queue_remove(s.index, s.scratch, job)
    elif job.state in HOLDING:
        _vacate(s, job)
        hold_remove(s.index, job)
    if isinstance(ev, T.JobFinished):
        final = FINISHED
        _learn_runtime(s, job, ev.run_ms)
    else:
        final = "failed" if isinstance(ev, T.JobFailed) else "cancelled"
    s.canonical.done[job.id] = final
    s.canonical.done_count += 1
    s.canonical.done_hash = hashlib.sha256(f"{s.canonical.done_hash}|{job.id}|{final}".encode()).hexdigest()


def _learn_runtime(s: State, job: Job, run_ms: int) -> None:
    key = f"{job.team}/{job.kind}"
    before = s.canonical.estimates.get(key)
    after = s.canonical.estimates[key] = _with_sample(before or Estimate(), run_ms)
    samples_min = s.canonical.policy.estimate_samples_min
    if _runtime_used(before, samples_min) == _runtime_used(after, samples_min):
        return  # no forecast uses another runtime (too few samples yet, or the same mean)
    # The jobs of this team and kind expect other runtimes now: their memoised release
    # specs see the new estimate (core.forecast.waits.release_spec); the release lists go,
    # and the forecasts kept across time of the nodes holding them are made again.
    jobs = s.canonical.jobs
    holders = s.index.holders_by_kind.get(key, {})
    nodes = [slot.node for job_id in holders for slot in jobs[job_id].placement]
    forget_release_lists(s.scratch, nodes)


def _runtime_used(est: Estimate | None, samples_min: int) -> int | None:
    """The runtime a forecast takes from a learned estimate (`expected_runtime_ms`), None
    while it has too few samples to be used."""
    return int(est.mean_ms) if est is not None and est.samples >= samples_min else None


def _with_sample(est: Estimate, value_ms: int) -> Estimate:
    samples = est.samples + 1
    return Estimate(samples=samples, mean_ms=est.mean_ms + (value_ms - est.mean_ms) / samples)


def _job_requeued(s: State, ev: T.JobRequeued) -> None:
    job = s.canonical.jobs[ev.job]
    if job.state in HOLDING:
        _vacate(s, job)
        hold_remove(s.index, job)
    restored = job.checkpoints[-1].progress_ms if job.checkpoints else 0
    job.progress_ms = restored
    job.run_started_t = 0
    job.frozen_t = 0
    job.ckpt_started_t = 0
    job.saga = ""
    job.overdue_saga = ""
    job.state = QUEUED
    job.preempt_count = ev.preempt_count
    if ev.reason == "preempted":
        job.lost_total_ms += ev.lost_progress_ms
    job.boost = ev.boost
    job.eff_level = max(0, job.level - ev.boost)
    job.queued_since_t = ev.t
    job.level_since_t = ev.t
    job.resume_pending = bool(job.checkpoints)
    job.placement = []
    queue_add(s.index, s.scratch, job, s.canonical.policy.aging_levels_max)


def _job_held(s: State, ev: T.JobHeld) -> None:
    job = s.canonical.jobs[ev.job]
    queue_remove(s.index, s.scratch, job)
    job.state = HELD


def _job_hold_released(s: State, ev: T.JobHoldReleased) -> None:
    job = s.canonical.jobs[ev.job]
    job.state = QUEUED
    job.level_since_t = ev.t
    queue_add(s.index, s.scratch, job, s.canonical.policy.aging_levels_max)


def _job_level_set(s: State, ev: T.JobLevelSet) -> None:
    """The new level is the job's base level and the level it asks for (it is no downgrade
    to restore): its queue, what it may preempt and be preempted by; aging starts over."""
    job = s.canonical.jobs[ev.job]
    queued = job.state == QUEUED
    holding = job.state in HOLDING
    if queued:
        queue_remove(s.index, s.scratch, job)
    if holding:
        hold_remove(s.index, job)
    job.level = job.requested_level = ev.level
    job.raisable_by_owner = ev.raisable_by_owner
    job.eff_level = max(0, ev.level - job.boost)
    job.level_since_t = ev.t
    if queued:
        queue_add(s.index, s.scratch, job, s.canonical.policy.aging_levels_max)
    if holding:
        hold_add(s.index, job)


def _priority_aged(s: State, ev: T.PriorityAged) -> None:
    job = s.canonical.jobs[ev.job]
    queue_remove(s.index, s.scratch, job)
    job.eff_level = ev.to_level
    job.level_since_t = ev.t
    queue_add(s.index, s.scratch, job, s.canonical.policy.aging_levels_max)


def _checkpoint_began(s: State, ev: T.CheckpointBegan) -> None:
    s.canonical.jobs[ev.job].ckpt_started_t = ev.t


def _checkpoint_recorded(s: State, ev: T.CheckpointRecorded) -> None:
    job = s.canonical.jobs[ev.job]
    if job.ckpt_started_t and job.state in (RUNNING, PREEMPTING):
        # Training pauses while a checkpoint is written: that time is overhead, not progress.
        pause_end = job.frozen_t if job.frozen_t else ev.t
        job.progress_ms -= max(0, pause_end - max(job.ckpt_started_t, job.run_started_t))
    job.checkpoints = (
        job.checkpoints
        + [
            Checkpoint(
                step=ev.step,
                digest=ev.digest,
                bytes=ev.bytes,
                progress_ms=ev.progress_ms,
                t=ev.t,
                path=ev.path,
                node=_reporter(s, job, ev.path),
            )
        ]
    )[-s.canonical.policy.checkpoints_kept :]
    job.ckpt_started_t = 0


def _reporter(s: State, job, path: str) -> str:
    """The node whose host delivers a file checkpoint's report (its run's first part's, which
    alone reports), where the policy has the log say so ('' otherwise)."""
    if not (s.canonical.policy.host_copies_job_checkpoints and job.placement and is_job_written(path)):
        return ""
    return job.placement[0].node


def _checkpoint_failed(s: State, ev: T.CheckpointFailedRecorded) -> None:
    s.canonical.jobs[ev.job].ckpt_started_t = 0


def _checkpoint_fallback(s: State, ev: T.CheckpointFallback) -> None:
    job = s.canonical.jobs[ev.job]
    keep: list[Checkpoint] = []
    for ckpt in job.checkpoints:
        if ckpt.digest == ev.bad_digest:
            break
        keep.append(ckpt)
    job.checkpoints = keep
    if job.state != RUNNING:
        job.progress_ms = keep[-1].progress_ms if keep else 0


def _safe_point(s: State, ev: T.SafePointReached) -> None:
    job = s.canonical.jobs[ev.job]
    if job.frozen_t == 0:
        job.frozen_t = ev.t
        saga = s.canonical.sagas.get(job.saga)
        if saga is not None:
            s.canonical.safe_point_latency = _with_sample(
                s.canonical.safe_point_latency, ev.t - saga.planned_t
            )


JOB_HANDLERS: dict[type, typing.Callable[[State, typing.Any], None]] = {
    T.JobSubmitted: _job_submitted,
    T.JobStartRequested: _start_requested,
    T.JobResumeRequested: _start_requested,
    T.JobRunning: _job_running,
    T.JobFinished: _job_ended,
    T.JobFailed: _job_ended,
    T.JobCancelled: _job_ended,
    T.JobRequeued: _job_requeued,
    T.PriorityAged: _priority_aged,
    T.CheckpointBegan: _checkpoint_began,
    T.CheckpointRecorded: _checkpoint_recorded,
    T.CheckpointFailedRecorded: _checkpoint_failed,
    T.CheckpointFallback: _checkpoint_fallback,
    T.SafePointReached: _safe_point,
    T.JobHeld: _job_held,
    T.JobHoldReleased: _job_hold_released,
    T.JobLevelSet: _job_level_set,
}
