"""Preemption sagas: start one (plan -> notices), let victims go, commit when every victim
has released (the preemptor starts on their GPUs, the victims requeue), roll back when it
cannot complete (victims keep running or get their own GPUs back), and expire it at its
deadline. A saga is atomic: either every victim let go and the preemptor started, or
nobody lost their place. Requeues grant the recovery boost and compensation, and a
started saga counts toward the fairness windows of the teams it touches.
"""

from __future__ import annotations

import msgspec

from ..model import types as T
from ..rules.fairness import quota_recovers_t, team_limit
from ..log.seal import Ctx
from ..model.placement import placement_nodes, resume_points, run_details
from .placement import request_start
from ..model.bands import requeue_boost
from ..model.state import recovery_boost
from ..rules.compensation import compensation_due, first_compensation
from ..rules.notices import notice_deadline
from ..rules.copies import checkpoint_save_ms
from ..model.entities import (
    PREEMPTING,
    RELEASED,
    RUNNING,
    Job,
    job_progress_ms,
    last_checkpoint,
    window_count,
)
from ..model.types import LEVELS


def release_victim(ctx: Ctx, job: Job) -> None:
    """A victim let go of its GPUs: record the progress it lost since its last checkpoint."""
    last = last_checkpoint(job)
    progress = job_progress_ms(job, ctx.inp.t)
    lost = progress - (last.progress_ms if last else 0)
    ctx.emit(T.VictimReleased(t=ctx.inp.t, saga=job.saga, job=job.id, lost_progress_ms=lost))


def commit_if_complete(ctx: Ctx, saga_id: str) -> None:
    """Once every victim of the saga has released: commit it, start the preemptor on their GPUs
    and requeue the victims."""
    c = ctx.state.canonical
    saga = c.sagas.get(saga_id)
    if saga is None:
        return
    pending = [v for v in saga.victims if v in c.jobs and c.jobs[v].state == PREEMPTING]
    if pending:
        return
    t = ctx.inp.t
    ctx.emit(T.PreemptionCommitted(t=t, saga=saga.id, preemptor=saga.preemptor, victims=saga.victims))
    preemptor = c.jobs[saga.preemptor]
    request_start(ctx, preemptor, saga.placement)
    for victim_id in saga.victims:
        victim = c.jobs.get(victim_id)
        if victim is not None and victim.state == RELEASED:
            requeue(ctx, victim, "preempted", counts_as_preemption=True)


def rollback(ctx: Ctx, saga_id: str, reason: str, lost_node: str = "") -> None:
    """Undo a saga: victims that have not released keep running (notice withdrawn); released
    ones get their own GPUs back from their fresh checkpoint, or requeue if their node is
    gone."""
    c = ctx.state.canonical
    saga = c.sagas[saga_id]
    t = ctx.inp.t
    ctx.emit(
        T.PreemptionRolledBack(
            t=t, saga=saga_id, reason=reason, preemptor=saga.preemptor, victims=saga.victims
        )
    )
    for victim_id in saga.victims:
        victim = c.jobs.get(victim_id)
        if victim is None:
            continue
        if victim.state == RUNNING:  # had not released: it keeps running
            ctx.emit(
                T.NoticeWithdrawn(t=t, saga=saga_id, job=victim_id, nodes=placement_nodes(victim.placement))
            )
        elif victim.state == RELEASED and lost_node in placement_nodes(victim.placement):
            requeue(ctx, victim, "node_lost", counts_as_preemption=False)
        elif victim.state == RELEASED:  # gets its own GPUs back, from its fresh checkpoint
            last = last_checkpoint(victim)
            ctx.emit(
                T.JobResumeRequested(
                    t=t,
                    job=victim_id,
                    placement=victim.placement,
                    nodes=placement_nodes(victim.placement),
                    ckpt_step=last.step if last else 0,
                    ckpt_digest=last.digest if last else "",
                    reason="rolled_back",
                    command=victim.command,
                    resume_points=resume_points(victim),
                    **run_details(c, victim, placement_nodes(victim.placement)),
                )
            )


def expire_sagas(ctx: Ctx) -> None:
    """Roll back every saga past its deadline. Victims still letting go are marked overdue
    first (when late releases count), so that one letting go after all counts as preempted."""
    c = ctx.state.canonical
    for saga_id in sorted(c.sagas):
        saga = c.sagas[saga_id]
        if saga.deadline_t < ctx.inp.t:
            if c.policy.late_release_counts_as_preemption:
                for victim_id in saga.victims:
                    victim = c.jobs.get(victim_id)
                    if victim is not None and victim.state == PREEMPTING:
                        ctx.emit(
                            T.NoticeOverdue(
                                t=ctx.inp.t, saga=saga_id, job=victim_id, deadline_t=saga.deadline_t
                            )
                        )
            rollback(ctx, saga_id, "deadline_passed")


def release_late(ctx: Ctx, job: Job) -> None:
    """A victim let go after its saga's deadline: the saga's record says so, and the job
    queues again counted as preempted."""
    last = last_checkpoint(job)
    lost = job_progress_ms(job, ctx.inp.t) - (last.progress_ms if last else 0)
    ctx.emit(
        T.VictimReleasedLate(t=ctx.inp.t, saga=job.overdue_saga, job=job.id, lost_progress_ms=max(0, lost))
    )
    requeue(ctx, job, "preempted", counts_as_preemption=True)


def requeue(ctx: Ctx, job: Job, reason: str, counts_as_preemption: bool) -> None:
    """Put a job back in the queue with its recovery boost (and compensation once it has been
    preempted often enough)."""
    c = ctx.state.canonical
    p = c.policy
    t = ctx.inp.t
    count = job.preempt_count + (1 if counts_as_preemption else 0)
    boost = recovery_boost(p, count, job.waited_total_ms)
    last = last_checkpoint(job)
    lost = job_progress_ms(job, t) - (last.progress_ms if last else 0)
    if counts_as_preemption and compensation_due(p, count)[0]:
        boost = min(LEVELS - 1, boost + p.compensation_priority_boost)
        _compensate(ctx, job, count, max(0, lost))
    boost, _ = requeue_boost(p, job.level, boost)
    ctx.emit(
        T.JobRequeued(
            t=t, job=job.id, boost=boost, reason=reason, lost_progress_ms=max(0, lost), preempt_count=count
        )
    )


def _compensate(ctx: Ctx, job: Job, count: int, lost_ms: int) -> None:
    """Past the threshold, a grant proportional to the progress lost: at the threshold, all
    the job lost to its preemptions so far (and their checkpoint and restore overheads);
    after it, what each further preemption loses. The quota bonus is for a while."""
    p = ctx.state.canonical.policy
    t = ctx.inp.t
    at_threshold = count == first_compensation(p)
    basis_ms = lost_ms + (job.lost_total_ms if at_threshold else 0)
    overhead_ms = (checkpoint_save_ms(job, p) + job.restore_cost_ms) * (count if at_threshold else 1)
    lost_gpu_hours = job.gpus * (basis_ms + overhead_ms) / 3_600_000
    grants = [
        ("quota_gpu_hours", round(lost_gpu_hours * p.compensation_quota_gpu_hours_per_lost, 6)),
        ("priority_boost", float(p.compensation_priority_boost)),
        ("fee_credit", round(lost_gpu_hours * p.fee_credit_per_gpu_hour, 6)),
    ]
    for kind, amount in grants:
        until = t + p.compensation_quota_ms if kind == "quota_gpu_hours" else 0
        ctx.emit(
            T.CompensationGranted(
                t=t,
                job=job.id,
                team=job.team,
                kind=kind,
                amount=amount,
                preempt_count=count,
                user=job.user,
                until_t=until,
                lost_progress_ms=basis_ms,
            )
        )


def start_saga(ctx: Ctx, job: Job, plan) -> None:
    """Start a preemption saga for `job` from its plan: the plan, a notice to each victim with
    the deadline, and the fairness counts it touches."""
    c = ctx.state.canonical
    p = c.policy
    t = ctx.inp.t
    saga_id = f"saga-{c.saga_count + 1}"
    deadline, _ = notice_deadline(
        p, t, [c.jobs[v] for v in plan.victims], plan.ready_ms, p.release_wait_max_ms[job.level]
    )
    victim_nodes = sorted(dict.fromkeys(s.node for v in plan.victims for s in c.jobs[v].placement))
    ctx.emit(
        T.PreemptionPlanned(
            t=t,
            saga=saga_id,
            preemptor=job.id,
            victims=plan.victims,
            placement=plan.placement,
            deadline_t=deadline,
            benefit=plan.benefit,
            cost=plan.cost,
            reason=plan.reason,
            victim_nodes=victim_nodes,
            reclaim=plan.reclaim,
            own_work_counted=False,
            depth=plan.depth,
            levels_down=plan.levels_down,
            regret_max=plan.regret_max or msgspec.UNSET,
        )
    )
    for victim_id in plan.victims:
        victim = c.jobs[victim_id]
        ctx.emit(
            T.VictimNotified(
                t=t,
                saga=saga_id,
                job=victim_id,
                nodes=placement_nodes(victim.placement),
                deadline_t=deadline,
                checkpoint_needed=plan.checkpoint_needed[victim_id],
                reason=plan.reason,
                preemptor=job.id,
                preemptor_level=job.level,
                gpus=list(victim.placement),
            )
        )
    if not plan.reclaim:  # giving back GPUs above a team's share is no unfairness to count
        _fairness_after_plan(ctx, job, plan.victims)


def _fairness_after_plan(ctx: Ctx, preemptor: Job, victims: list[str]) -> None:
    c = ctx.state.canonical
    p = c.policy
    t = ctx.inp.t
    teams = sorted(dict.fromkeys(c.jobs[v].team for v in victims if c.jobs[v].team != preemptor.team))
    if not teams:  # the team reordered its own work: nothing counted (see evolve)
        return
    for team in teams:
        win = c.team_windows.get(team)
        count = window_count(win.preempted, t, p.fairness_window_ms) if win else 0
        if (
            count >= team_limit(ctx.state, team, p.team_preempted_max)
            and c.team_protected_until.get(team, 0) <= t
        ):
            ctx.emit(
                T.TeamProtected(t=t, team=team, until_t=t + p.team_protect_ms, preempted_in_window=count)
            )
    win = c.team_windows.get(preemptor.team)
    count = window_count(win.preempting, t, p.fairness_window_ms) if win else 0
    limit = team_limit(ctx.state, preemptor.team, p.team_preempting_max)
    if count >= limit:
        # (A limit of 0 counts even a team with no window yet.)
        until = quota_recovers_t(win.preempting if win else [], limit, p.fairness_window_ms)
        if until > c.team_downgraded_until.get(preemptor.team, 0):
            ctx.emit(T.TeamDowngraded(t=t, team=preemptor.team, until_t=until, preempting_in_window=count))
