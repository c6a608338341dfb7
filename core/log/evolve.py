"""`evolve(state, event)`: the only code that changes a State.

Decisions emit events; each event is applied here at once, so a replay of the log through
`evolve` alone rebuilds exactly the state the live scheduler had. Handlers trust the
event: checks belong to the decision that emitted it.

Over 500 lines on purpose: one small handler per event type, and the whole fold in one
file, so that an auditor reads in one place everything that can change a state.
"""

from __future__ import annotations

import hashlib
import typing

from ..model import types as T
from ..forecast.waits import release_spec
from ..model.policy import with_params
from ..model.state import (
    FINISHED,
    HELD,
    HOLDING,
    PREEMPTING,
    QUEUED,
    RELEASED,
    RESERVED,
    RUNNING,
    STARTING,
    Checkpoint,
    Job,
    Ledger,
    LevelWait,
    Node,
    Saga,
    State,
    Window,
    Estimate,
    forget_node,
    node_known,
    forget_pass_memory,
    forget_release_lists,
    forget_releases,
    forget_remaining,
    hold_add,
    hold_remove,
    job_progress_ms,
    queue_add,
    queue_remove,
    set_holder,
    touch_job,
    _index_node_capacity,
    node_free_count,
    rebuild_index,
)

LEVEL_WAIT_HORIZON = 100  # samples in the running mean of a level's wait


def evolve(state: State, ev: T.Event) -> None:
    """Apply one event to the state: the only code that changes a State (the clock moves to the
    event's time)."""
    state.canonical.t = ev.t
    handler = _HANDLERS.get(type(ev))
    if handler is not None:
        handler(state, ev)
        for job_id in touched_jobs(ev):
            touch_job(state, job_id, release_spec)


def touched_jobs(ev: T.Event) -> list[str]:
    """The jobs an event's handler may change: the one it names, or a saga's preemptor and
    victims. Handlers must not change any other job (a test compares the kept digest with
    one computed from scratch)."""
    fields = _JOB_FIELDS.get(type(ev))
    if fields is None:  # not an event type of the union: read every field that may name jobs
        fields = ("job", "preemptor", "victims")
    if not fields:
        return []
    if fields == ("job",):  # most events name one job
        job = getattr(ev, "job", "")
        return [job] if job else []
    names = [getattr(ev, "job", ""), getattr(ev, "preemptor", "")] + list(getattr(ev, "victims", []))
    return [name for name in names if name]


# Event type -> which of the fields that name jobs it has ("job", "preemptor", "victims").
_JOB_FIELDS = {
    cls: tuple(name for name in ("job", "preemptor", "victims") if name in cls.__struct_fields__)
    for cls in typing.get_args(T.Event)
}


# ---------------------------------------------------------------- nodes


def _node_joined(s: State, ev: T.NodeJoined) -> None:
    node = Node(name=ev.node, gpu_model=ev.gpu_model, gpus=ev.gpus, holder=[""] * ev.gpus, addr=ev.addr)
    known = s.canonical.nodes.get(ev.node)
    if known is not None:
        node_known(s.index, known, -1)
    node_known(s.index, node, 1)
    s.canonical.nodes[ev.node] = node
    s.index.nodes_sorted = None
    forget_node(s.index, ev.node)
    _index_node_capacity(s.index, node)


def _node_lost(s: State, ev: T.NodeLost) -> None:
    node = s.canonical.nodes[ev.node]
    ix = s.index
    model = node.gpu_model
    free = node_free_count(node)
    ix.capacity_by_model[model] -= node.gpus
    ix.total_gpus -= node.gpus
    ix.free_by_model[model] -= free
    bucket = ix.free_buckets[model][free]
    del bucket[node.name]
    if not bucket:
        del ix.free_buckets[model][free]
    sizes = [
        n.gpus
        for name, n in sorted(s.canonical.nodes.items())
        if n.up and n.gpu_model == model and name != node.name
    ]
    ix.node_size_max_by_model[model] = max(sizes, default=0)
    node.up = False
    node.holder = [""] * node.gpus
    ix.jobs_by_node.pop(node.name, None)
    forget_node(ix, node.name)


# ---------------------------------------------------------------- jobs


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
    queue_add(s.index, job, s.canonical.policy.aging_levels_max)


def _occupy(s: State, job: Job, placement: list[T.Slot]) -> None:
    for slot in placement:
        for gpu in slot.gpus:
            set_holder(s.canonical, s.index, slot.node, gpu, job.id)
        s.index.jobs_by_node.setdefault(slot.node, {})[job.id] = None
    forget_releases(s.index, placement)


def _free_slots(s: State, slots: list[T.Slot], holder: str) -> None:
    """Free the GPUs of these slots that `holder` still holds."""
    for slot in slots:
        node = s.canonical.nodes[slot.node]
        for gpu in slot.gpus:
            if node.holder[gpu] == holder:
                set_holder(s.canonical, s.index, slot.node, gpu, "")


def _vacate(s: State, job: Job) -> None:
    _free_slots(s, job.placement, job.id)
    for slot in job.placement:
        on_node = s.index.jobs_by_node.get(slot.node)
        if on_node is not None:
            on_node.pop(job.id, None)
    forget_releases(s.index, job.placement)


def _start_requested(s: State, ev: T.JobStartRequested | T.JobResumeRequested) -> None:
    job = s.canonical.jobs[ev.job]
    if job.state == QUEUED:
        queue_remove(s.index, job)
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
        queue_remove(s.index, job)
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
    s.canonical.estimates[key] = _with_sample(s.canonical.estimates.get(key) or Estimate(), run_ms)
    # The jobs of this team and kind expect other runtimes now: their memoised release
    # specs see the new estimate (core.forecast.waits.release_spec); the release lists go.
    forget_release_lists(s.index)


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
    queue_add(s.index, job, s.canonical.policy.aging_levels_max)


def _job_held(s: State, ev: T.JobHeld) -> None:
    job = s.canonical.jobs[ev.job]
    queue_remove(s.index, job)
    job.state = HELD


def _job_hold_released(s: State, ev: T.JobHoldReleased) -> None:
    job = s.canonical.jobs[ev.job]
    job.state = QUEUED
    job.level_since_t = ev.t
    queue_add(s.index, job, s.canonical.policy.aging_levels_max)


def _job_level_set(s: State, ev: T.JobLevelSet) -> None:
    """The new level is the job's base level and the level it asks for (it is no downgrade
    to restore): its queue, what it may preempt and be preempted by; aging starts over."""
    job = s.canonical.jobs[ev.job]
    queued = job.state == QUEUED
    holding = job.state in HOLDING
    if queued:
        queue_remove(s.index, job)
    if holding:
        hold_remove(s.index, job)
    job.level = job.requested_level = ev.level
    job.raisable_by_owner = ev.raisable_by_owner
    job.eff_level = max(0, ev.level - job.boost)
    job.level_since_t = ev.t
    if queued:
        queue_add(s.index, job, s.canonical.policy.aging_levels_max)
    if holding:
        hold_add(s.index, job)


def _priority_aged(s: State, ev: T.PriorityAged) -> None:
    job = s.canonical.jobs[ev.job]
    queue_remove(s.index, job)
    job.eff_level = ev.to_level
    job.level_since_t = ev.t
    queue_add(s.index, job, s.canonical.policy.aging_levels_max)


# ---------------------------------------------------------------- checkpoints


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
            )
        ]
    )[-s.canonical.policy.checkpoints_kept :]
    job.ckpt_started_t = 0


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


# ---------------------------------------------------------------- sagas


def _preemption_planned(s: State, ev: T.PreemptionPlanned) -> None:
    c = s.canonical
    preemptor = c.jobs[ev.preemptor]
    queue_remove(s.index, preemptor)
    hold_add(s.index, preemptor)
    preemptor.state = RESERVED
    preemptor.saga = ev.saga
    preemptor.placement = list(ev.placement)
    for slot in ev.placement:
        node = c.nodes[slot.node]
        for gpu in slot.gpus:
            if node.holder[gpu] == "":
                set_holder(c, s.index, slot.node, gpu, preemptor.id)
    # The fairness windows count what a team or user does to others: reordering one's own
    # work (an urgent job displacing its own team's, or its own user's, batch job) is not
    # counted against either side (in logs that record so: `own_work_counted`).
    other_team = other_user = ev.own_work_counted
    for victim_id in ev.victims:
        victim = c.jobs[victim_id]
        victim.state = PREEMPTING
        victim.saga = ev.saga
        victim.cascade_depth = ev.depth
        if ev.own_work_counted or victim.team != preemptor.team:
            other_team = True
            if not ev.reclaim:
                _window(c.team_windows, victim.team).preempted.append(ev.t)
        if ev.own_work_counted or victim.user != preemptor.user:
            other_user = True
            _window(c.user_windows, victim.user).preempted.append(ev.t)
    if preemptor.level < c.policy.downgrade_applies_below_level and not ev.reclaim and other_team:
        # The team limit guards the levels its penalty (a downgrade) applies to: a team's
        # mid-level jobs preempting on their own merits do not cost its urgent jobs a level.
        _window(c.team_windows, preemptor.team).preempting.append(ev.t)
    if other_user:
        _window(c.user_windows, preemptor.user).preempting.append(ev.t)
    _prune_windows(c, ev.t)
    c.sagas[ev.saga] = Saga(
        id=ev.saga,
        preemptor=ev.preemptor,
        victims=list(ev.victims),
        released=[],
        placement=list(ev.placement),
        deadline_t=ev.deadline_t,
        planned_t=ev.t,
        benefit=ev.benefit,
        cost=ev.cost,
        reclaim=ev.reclaim,
    )
    c.saga_count += 1


def _window(windows: dict[str, Window], key: str) -> Window:
    win = windows.get(key)
    if win is None:
        win = windows[key] = Window()
    return win


def _prune_windows(c, t: int) -> None:
    start = t - c.policy.fairness_window_ms
    for windows in (c.team_windows, c.user_windows):
        for key in sorted(windows):
            win = windows[key]
            win.preempting = [x for x in win.preempting if x > start]
            win.preempted = [x for x in win.preempted if x > start]
            if not win.preempting and not win.preempted:
                del windows[key]


def _victim_released(s: State, ev: T.VictimReleased) -> None:
    c = s.canonical
    saga = c.sagas[ev.saga]
    victim = c.jobs[ev.job]
    victim.progress_ms = job_progress_ms(victim, ev.t)
    victim.run_started_t = 0
    victim.frozen_t = 0
    _vacate(s, victim)
    hold_remove(s.index, victim)
    victim.state = RELEASED
    for slot in victim.placement:
        for gpu in slot.gpus:
            set_holder(c, s.index, slot.node, gpu, saga.preemptor)
    wanted = {(slot.node, gpu): None for slot in saga.placement for gpu in slot.gpus}
    for slot in victim.placement:
        extra = [gpu for gpu in slot.gpus if (slot.node, gpu) not in wanted]
        if extra:
            saga.held_extra.append(T.Slot(node=slot.node, gpus=extra))
    saga.released.append(ev.job)


def _free_held_extra(s: State, saga: Saga) -> None:
    _free_slots(s, saga.held_extra, saga.preemptor)


def _preemption_committed(s: State, ev: T.PreemptionCommitted) -> None:
    _free_held_extra(s, s.canonical.sagas.pop(ev.saga))


def _preemption_rolled_back(s: State, ev: T.PreemptionRolledBack) -> None:
    c = s.canonical
    saga = c.sagas.pop(ev.saga)
    _free_held_extra(s, saga)
    retry_t = ev.t + c.policy.preemption_retry_ms
    preemptor = c.jobs.get(saga.preemptor)
    if preemptor is not None and preemptor.state == RESERVED:
        _vacate(s, preemptor)
        hold_remove(s.index, preemptor)
        preemptor.state = QUEUED
        preemptor.saga = ""
        preemptor.placement = []
        preemptor.preempt_retry_t = retry_t
        queue_add(s.index, preemptor, s.canonical.policy.aging_levels_max)
    for victim_id in saga.victims:
        victim = c.jobs.get(victim_id)
        if victim is None:
            continue
        victim.saga = ""
        if victim.state == PREEMPTING:
            victim.progress_ms = job_progress_ms(victim, ev.t)
            victim.run_started_t = ev.t
            victim.frozen_t = 0
            victim.state = RUNNING
            victim.cascade_depth = 0
            victim.protected_until_t = max(victim.protected_until_t, retry_t)


# ---------------------------------------------------------------- fairness, ledger, policy


def _declined(s: State, ev: T.PreemptionDeclined) -> None:
    s.canonical.jobs[ev.job].last_decline = ev.reason


def _team_protected(s: State, ev: T.TeamProtected) -> None:
    s.canonical.team_protected_until[ev.team] = ev.until_t


def _team_downgraded(s: State, ev: T.TeamDowngraded) -> None:
    s.canonical.team_downgraded_until[ev.team] = ev.until_t


def _level_restored(s: State, ev: T.JobLevelRestored) -> None:
    job = s.canonical.jobs[ev.job]
    queue_remove(s.index, job)
    job.level = ev.level
    job.eff_level = min(job.eff_level, ev.level)
    job.level_since_t = ev.t
    queue_add(s.index, job, s.canonical.policy.aging_levels_max)


def _compensation(s: State, ev: T.CompensationGranted) -> None:
    entry = s.canonical.ledger.get(ev.team) or Ledger()
    if ev.kind == "quota_gpu_hours" and ev.until_t:
        # A time-limited bonus: the newest grant's end holds for the sum (older logs: for good).
        if entry.quota_bonus_until_t <= ev.t:
            entry.quota_bonus_gpu_hours = 0.0
        entry.quota_bonus_gpu_hours += ev.amount
        entry.quota_bonus_until_t = max(entry.quota_bonus_until_t, ev.until_t)
    elif ev.kind == "quota_gpu_hours":
        entry.quota_gpu_hours += ev.amount
    elif ev.kind == "fee_credit":
        entry.fee_credit += ev.amount
    else:
        entry.priority_boosts += int(ev.amount)
    s.canonical.ledger[ev.team] = entry
    job = s.canonical.jobs.get(ev.job)
    if job is not None and ev.kind == "fee_credit":
        job.compensations += 1


def _policy_changed(s: State, ev: T.PolicyChanged) -> None:
    before = s.canonical.policy
    s.canonical.policy = with_params(before, ev.params)
    s.canonical.policy_params = {**s.canonical.policy_params, **ev.params}
    s.index.variant_policies.clear()
    forget_remaining(s.index)
    s.index.placement_dirty = True
    if s.canonical.policy.aging_levels_max != before.aging_levels_max:
        s.index = rebuild_index(s.canonical)  # which jobs may still age changed


def _scheduler_started(s: State, ev: T.SchedulerStarted) -> None:
    forget_pass_memory(s.index)


def _input_rejected(s: State, ev: T.InputRejected) -> None:
    if ev.reason == T.INTERNAL_ERROR:  # the state was folded back from the log
        forget_pass_memory(s.index)


_HANDLERS: dict[type, typing.Callable[[State, typing.Any], None]] = {
    T.InputRejected: _input_rejected,
    T.SchedulerStarted: _scheduler_started,
    T.NodeJoined: _node_joined,
    T.NodeLost: _node_lost,
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
    T.PreemptionPlanned: _preemption_planned,
    T.VictimReleased: _victim_released,
    T.PreemptionCommitted: _preemption_committed,
    T.PreemptionRolledBack: _preemption_rolled_back,
    T.PreemptionDeclined: _declined,
    T.TeamProtected: _team_protected,
    T.TeamDowngraded: _team_downgraded,
    T.JobLevelRestored: _level_restored,
    T.CompensationGranted: _compensation,
    T.PolicyChanged: _policy_changed,
    T.JobHeld: _job_held,
    T.JobHoldReleased: _job_hold_released,
    T.JobLevelSet: _job_level_set,
}
