"""The input handlers: each input is checked (a bad one gets `InputRejected` with a reason
that says what to fix) and turned into events. `HANDLERS` maps an input type to its
handler; the scheduling pass that follows every accepted input is `core.machine.schedule`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .model import types as T
from .model.bounds import id_problem
from .rules.fairness import team_downgrade_ends_t
from .level_requests import level_request_problem, raisable_by_owner_after
from .log.seal import Ctx, reject
from .model.placement import placement_nodes
from .preempt_contract import preempt_contract_problem, signal_name
from .model.policy import assign_variant
from .model.policy_defaults import set_policy_problem
from .passes.saga import commit_if_complete, release_late, release_victim, requeue, rollback
from .rules.notices import late_release_counts
from .model.state import State
from .model.entities import (
    HELD,
    HOLDING,
    PREEMPTING,
    QUEUED,
    RELEASED,
    RESERVED,
    RUNNING,
    STARTING,
    Job,
    job_progress_ms,
)
from .model.types import LEVELS
from .model.event_types import copy_said

JOB_ID_LENGTH_MAX = 200
ADDR_LENGTH_MAX = 255
CKPT_PATH_LENGTH_MAX = 4096

KIND_SUFFIX = re.compile(r"[-_.]?\d+$")


def common_problem(state: State, inp: T.Input) -> tuple[str, str] | None:
    """(reason, detail) when an input of any type cannot be applied (malformed, another schema
    version, time going back, already applied); None when it can."""
    if isinstance(inp, T.Malformed):
        return inp.reason, inp.error
    if inp.v != T.SCHEMA_VERSION:
        return "unsupported_schema_version", f"v={inp.v}; this scheduler reads v={T.SCHEMA_VERSION}"
    if inp.t < state.canonical.t:
        return "time_must_not_go_back", f"t={inp.t} is before the last recorded t={state.canonical.t}"
    if state.canonical.last_input_seq and 0 < inp.seq <= state.canonical.last_input_seq:
        return "input_already_applied", f"seq={inp.seq} <= last applied {state.canonical.last_input_seq}"
    return None


def _on_node_up(ctx: Ctx, inp: T.NodeUp) -> None:
    if not inp.node:
        return reject(ctx, "node_must_be_named")
    if inp.gpus <= 0:
        return reject(ctx, "gpus_must_be_positive", f"node {inp.node} reported {inp.gpus} GPUs")
    if not inp.gpu_model:
        return reject(ctx, "gpu_model_must_be_set")
    if len(inp.advertise_addr) > ADDR_LENGTH_MAX or any(ch.isspace() for ch in inp.advertise_addr):
        return reject(
            ctx,
            "advertise_addr_invalid",
            f"a host name or IP address of at most {ADDR_LENGTH_MAX} characters",
        )
    node = ctx.state.canonical.nodes.get(inp.node)
    problem = None if node is not None else id_problem("node", inp.node)
    if problem:
        return reject(ctx, *problem)
    if node is not None and node.up:
        if node.gpus == inp.gpus and node.gpu_model == inp.gpu_model:
            return  # a repeated report: nothing changes, nothing is logged
        return reject(
            ctx,
            "node_already_up_with_other_inventory",
            f"{inp.node} is up with {node.gpus}x{node.gpu_model}; send node_down first",
        )
    ctx.emit(
        T.NodeJoined(t=inp.t, node=inp.node, gpu_model=inp.gpu_model, gpus=inp.gpus, addr=inp.advertise_addr)
    )


def _on_node_down(ctx: Ctx, inp: T.NodeDown) -> None:
    node = ctx.state.canonical.nodes.get(inp.node)
    if node is None or not node.up:
        return reject(ctx, "unknown_node", f"{inp.node} is not up")
    lose_node(ctx, inp.node, inp.reason)


def lose_node(ctx: Ctx, node_name: str, reason: str) -> None:
    """A node is gone: roll back the sagas that touch it, requeue the jobs it held (not counted
    as preemptions), and record the loss."""
    c = ctx.state.canonical
    t = ctx.inp.t
    for saga_id in sorted(c.sagas):
        saga = c.sagas[saga_id]
        touched = any(slot.node == node_name for slot in saga.placement) or any(
            slot.node == node_name for v in saga.victims if v in c.jobs for slot in c.jobs[v].placement
        )
        if touched:
            rollback(ctx, saga_id, "node_lost", lost_node=node_name)
    jobs = sorted(ctx.state.index.jobs_by_node.get(node_name, {}))
    for job_id in jobs:
        job = c.jobs[job_id]
        if job.state in HOLDING:
            # A gang is one run: its parts on the nodes still up stop too.
            others = [n for n in placement_nodes(job.placement) if n != node_name]
            if others and job.state != RESERVED:
                ctx.emit(T.JobStopRequested(t=t, job=job.id, nodes=others, reason="node_lost"))
            requeue(ctx, job, "node_lost", counts_as_preemption=False)
    ctx.emit(T.NodeLost(t=t, node=node_name, reason=reason, jobs=jobs))


def _on_submit(ctx: Ctx, inp: T.Submit) -> None:
    c = ctx.state.canonical
    p = c.policy
    problem = _submit_problem(ctx.state, inp) or preempt_contract_problem(inp)
    if problem:
        return reject(ctx, *problem)
    level = inp.level
    if level < p.downgrade_applies_below_level and team_downgrade_ends_t(ctx.state, inp.team) > inp.t:
        # Truthful: while the team is downgraded its urgent jobs enter lower, until its
        # preemption quota recovers (then `core.passes.queues.restore_levels` gives queued ones
        # their level back).
        level = min(LEVELS - 1, level + p.downgrade_levels)
    ctx.emit(
        T.JobSubmitted(
            t=inp.t,
            job=inp.job,
            team=inp.team,
            user=inp.user,
            level=level,
            requested_level=inp.level,
            gpus=inp.gpus,
            gpu_models=sorted(inp.gpu_models),
            kind=inp.kind or KIND_SUFFIX.sub("", inp.job) or inp.job,
            est_runtime_s=_or(inp.est_runtime_s, p.default_est_runtime_s),
            ckpt_interval_s=_or(inp.ckpt_interval_s, p.default_ckpt_interval_s),
            ckpt_cost_s=_or(inp.ckpt_cost_s, p.default_ckpt_cost_s),
            restore_cost_s=_or(inp.restore_cost_s, p.default_restore_cost_s),
            safe_point_interval_s=_or(inp.safe_point_interval_s, p.default_safe_point_interval_s),
            preemptible=inp.preemptible,
            command=list(inp.command),
            variant=assign_variant(p, inp.team, inp.job, inp.user),
            preempt_signal=signal_name(inp.preempt_signal),
            grace_s=float(inp.grace_s or 0.0),
        )
    )


def _or(value: float | None, default: float) -> float:
    return float(default if value is None else value)


def _submit_problem(state, inp: T.Submit) -> tuple[str, str] | None:
    c = state.canonical
    if not inp.job:
        return "job_must_be_named", "give the job an id"
    if len(inp.job) > JOB_ID_LENGTH_MAX:
        return "job_id_too_long", f"at most {JOB_ID_LENGTH_MAX} characters"
    if inp.job in c.jobs or inp.job in c.done:
        return "job_id_already_used", f"{inp.job} was submitted before; pick a new id"
    if not inp.team:
        return "team_must_be_set", "every job belongs to a team"
    if not inp.user:
        return "user_must_be_set", "every job belongs to a user"
    problem = id_problem("job", inp.job) or id_problem("team", inp.team) or id_problem("user", inp.user)
    if problem:
        return problem
    if not 0 <= inp.level < LEVELS:
        return "level_must_be_0_to_7", f"got level {inp.level}"
    if inp.gpus <= 0:
        return "gpus_must_be_positive", f"got gpus {inp.gpus}"
    for name in (
        "est_runtime_s",
        "ckpt_interval_s",
        "ckpt_cost_s",
        "restore_cost_s",
        "safe_point_interval_s",
    ):
        value = getattr(inp, name)
        if value is not None and (value < 0 or math.isnan(value) or math.isinf(value)):
            return f"{name}_must_be_non_negative", f"got {name} {value}"
    if inp.est_runtime_s is not None and inp.est_runtime_s == 0:
        return "est_runtime_s_must_be_positive", "leave it out if unknown"
    return _never_fits(state, inp)


def _never_fits(state, inp: T.Submit) -> tuple[str, str] | None:
    """A job no node the pool has known could ever hold: of a model no node has, or a gang
    larger than all the nodes of any one model it accepts (a gang stays on one model). An
    empty pool refuses nothing: the nodes have not joined yet."""
    if not state.canonical.nodes:
        return None
    capacity = {model: gpus for model, (_, gpus) in state.index.known_by_model.items()}
    models = sorted(inp.gpu_models) or sorted(capacity)
    known = [m for m in models if m in capacity]
    if not known:
        return (
            "no_node_of_model",
            f"no node of {', '.join(models)} in the pool (it has"
            f" {', '.join(sorted(capacity))}): name one of those with --gpu-model",
        )
    largest = max(capacity[m] for m in known)
    if inp.gpus > largest:
        return (
            "gang_larger_than_pool",
            f"{inp.gpus} GPUs asked; the most any one model has is"
            f" {largest} ({', '.join(f'{m}: {capacity[m]}' for m in known)}): ask for at most {largest}",
        )
    return None


def _job_or_reject(ctx: Ctx, inp, states: tuple[str, ...]) -> Job | None:
    job = ctx.state.canonical.jobs.get(inp.job)
    if job is None:
        done = ctx.state.canonical.done.get(inp.job)
        reject(ctx, "unknown_job" if done is None else f"job_already_{done}", inp.job)
        return None
    attempt = getattr(inp, "attempt", 0)
    if attempt and job.run and attempt != job.run:
        tag = type(inp).__struct_config__.tag
        reject(
            ctx,
            "stale_run",
            f"{tag} for {job.id} comes from run {attempt}; its current run is"
            f" {job.run} (the host must stop the old run)",
        )
        return None
    if job.state not in states:
        tag = type(inp).__struct_config__.tag
        reject(ctx, f"job_is_{job.state}", f"{tag} for {job.id} needs it {' or '.join(states)}")
        return None
    return job


def _on_cancel(ctx: Ctx, inp: T.Cancel) -> None:
    job = _job_or_reject(ctx, inp, (QUEUED, HELD, STARTING, RUNNING, RESERVED, PREEMPTING, RELEASED))
    if job is None or (inp.by and not _allowed(ctx, inp, job)):
        return
    nodes = placement_nodes(job.placement) if job.state in (STARTING, RUNNING, PREEMPTING) else []
    if job.state == RESERVED:
        rollback(ctx, job.saga, "preemptor_cancelled")
    elif job.state == PREEMPTING:
        release_victim(ctx, job)
    ctx.emit(T.JobCancelled(t=inp.t, job=job.id, nodes=nodes))
    if job.saga and job.saga in ctx.state.canonical.sagas:
        commit_if_complete(ctx, ctx.state.canonical.sagas[job.saga].id)


def _on_started(ctx: Ctx, inp: T.Started) -> None:
    job = _job_or_reject(ctx, inp, (STARTING,))
    if job is None:
        return
    waited_ms, copy = inp.t - job.queued_since_t, copy_said(inp.restored_copy)
    ctx.emit(T.JobRunning(t=inp.t, job=job.id, waited_ms=waited_ms, restored_copy=copy))


def _on_checkpoint_started(ctx: Ctx, inp: T.CheckpointStarted) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, PREEMPTING))
    if job is not None:
        ctx.emit(T.CheckpointBegan(t=inp.t, job=job.id))


def _on_checkpoint_saved(ctx: Ctx, inp: T.CheckpointSaved) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, PREEMPTING, RELEASED))
    if job is None:
        return
    if not inp.digest:
        return reject(ctx, "digest_must_be_set", "a checkpoint without a digest cannot be verified")
    if inp.bytes < 0 or inp.step < 0:
        return reject(ctx, "step_and_bytes_must_be_non_negative")
    if len(inp.path) > CKPT_PATH_LENGTH_MAX or "\0" in inp.path:
        return reject(ctx, "checkpoint_path_invalid", f"a path of at most {CKPT_PATH_LENGTH_MAX} characters")
    # The checkpoint holds the progress made when the save began (training pauses to save).
    at = job.ckpt_started_t or job.frozen_t or inp.t
    progress = job_progress_ms(job, at) if job.state != RELEASED else job.progress_ms
    ctx.emit(
        T.CheckpointRecorded(
            t=inp.t,
            job=job.id,
            step=inp.step,
            digest=inp.digest,
            bytes=inp.bytes,
            progress_ms=progress,
            path=inp.path,
        )
    )


def _on_checkpoint_failed(ctx: Ctx, inp: T.CheckpointFailed) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, PREEMPTING, STARTING, RELEASED))
    if job is None:
        return
    if job.state == STARTING and inp.digest:
        return _fallback(ctx, job, inp.digest)
    ctx.emit(T.CheckpointFailedRecorded(t=inp.t, job=job.id, reason=inp.reason))
    if job.state == PREEMPTING:
        rollback(ctx, job.saga, "victim_checkpoint_failed")


def _fallback(ctx: Ctx, job: Job, bad_digest: str) -> None:
    index = next((i for i, ck in enumerate(job.checkpoints) if ck.digest == bad_digest), None)
    if index is None:
        return reject(ctx, "unknown_checkpoint_digest", f"{job.id} has no checkpoint {bad_digest}")
    good = job.checkpoints[index - 1] if index > 0 else None
    lost = job.checkpoints[index].progress_ms - (good.progress_ms if good else 0)
    ctx.emit(
        T.CheckpointFallback(
            t=ctx.inp.t,
            job=job.id,
            bad_digest=bad_digest,
            to_step=good.step if good else 0,
            to_digest=good.digest if good else "",
            lost_progress_ms=lost,
        )
    )


def _on_safe_point(ctx: Ctx, inp: T.SafePoint) -> None:
    job = _job_or_reject(ctx, inp, (PREEMPTING,))
    if job is not None:
        ctx.emit(T.SafePointReached(t=inp.t, job=job.id))


def _on_released(ctx: Ctx, inp: T.Released) -> None:
    job = _job_or_reject(ctx, inp, (PREEMPTING, RUNNING))
    if job is None:
        return
    if job.state == RUNNING:
        # Its saga was rolled back while the victim was letting go (the withdrawal came too
        # late): the run has ended all the same. It queues again, from its newest
        # checkpoint, instead of being held by a run that no longer exists. Past its saga's
        # deadline it was preempted all the same (see core/rules/notices.py).
        if late_release_counts(ctx.state.canonical.policy, job)[0]:
            release_late(ctx, job)
        else:
            requeue(ctx, job, "released_after_rollback", counts_as_preemption=False)
        return
    saga_id = job.saga
    release_victim(ctx, job)
    commit_if_complete(ctx, saga_id)


def _on_finished(ctx: Ctx, inp: T.Finished) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, STARTING, PREEMPTING))
    if job is None:
        return
    if inp.requeue and not inp.ok and job.state in (STARTING, RUNNING):
        # A part of the run could not start on its host, or was killed: the gang is stopped
        # whole and queues again (a new run, which may land elsewhere).
        nodes = placement_nodes(job.placement)
        ctx.emit(T.JobStopRequested(t=inp.t, job=job.id, nodes=nodes, reason="gang_part_lost"))
        requeue(ctx, job, "gang_part_lost", counts_as_preemption=False)
        return
    saga_id = job.saga
    if job.state == PREEMPTING:
        release_victim(ctx, job)
    run_ms = job_progress_ms(job, inp.t)
    nodes = placement_nodes(job.placement)
    if inp.ok:
        ctx.emit(T.JobFinished(t=inp.t, job=job.id, run_ms=run_ms, nodes=nodes))
    else:
        reason = "exited_with_error" if inp.exit_code is None else f"exit_code_{inp.exit_code}"
        ctx.emit(T.JobFailed(t=inp.t, job=job.id, run_ms=run_ms, reason=reason, nodes=nodes))
    if saga_id:
        commit_if_complete(ctx, saga_id)


def _allowed(ctx: Ctx, inp, job: Job) -> bool:
    """A person's request about a job: from its owner or an operator."""
    if not inp.by:
        reject(ctx, "by_must_be_set", "say who asks (the user name)")
        return False
    if inp.by != job.user and not inp.operator:
        reject(ctx, "not_your_job", f"{job.id} belongs to {job.user}; an operator may act on others' jobs")
        return False
    return True


def _on_hold(ctx: Ctx, inp: T.Hold) -> None:
    job = _job_or_reject(ctx, inp, (QUEUED,))
    if job is not None and _allowed(ctx, inp, job):
        ctx.emit(T.JobHeld(t=inp.t, job=job.id, by=inp.by))


def _on_release_hold(ctx: Ctx, inp: T.ReleaseHold) -> None:
    job = _job_or_reject(ctx, inp, (HELD,))
    if job is not None and _allowed(ctx, inp, job):
        ctx.emit(T.JobHoldReleased(t=inp.t, job=job.id, by=inp.by))


def _on_requeue(ctx: Ctx, inp: T.Requeue) -> None:
    job = _job_or_reject(ctx, inp, (STARTING, RUNNING))
    if job is None or not _allowed(ctx, inp, job):
        return
    ctx.emit(
        T.JobStopRequested(
            t=inp.t, job=job.id, nodes=placement_nodes(job.placement), reason="requeue_requested"
        )
    )
    requeue(ctx, job, "requeue_requested", counts_as_preemption=False)


def _on_set_level(ctx: Ctx, inp: T.SetLevel) -> None:
    job = _job_or_reject(ctx, inp, (QUEUED, HELD, STARTING, RUNNING))
    if job is None or not _allowed(ctx, inp, job):
        return
    problem = level_request_problem(job, inp.level, inp.operator)
    if problem:
        return reject(ctx, *problem)
    ctx.emit(
        T.JobLevelSet(
            t=inp.t,
            job=job.id,
            level=inp.level,
            from_level=job.level,
            by=inp.by,
            raisable_by_owner=raisable_by_owner_after(job, inp.level, inp.operator),
        )
    )


def _on_tick(ctx: Ctx, inp: T.Tick) -> None:
    return None


def _on_scheduler_start(ctx: Ctx, inp: T.SchedulerStart) -> None:
    ctx.emit(T.SchedulerStarted(t=inp.t, instance=inp.instance))


def _on_disown_record(ctx: Ctx, inp: T.DisownRecord) -> None:
    if inp.log_seq <= 0:
        return reject(ctx, "log_seq_must_be_positive", f"got {inp.log_seq}: the XR_EV sequence to disown")
    ctx.emit(
        T.RecordDisowned(
            t=inp.t, log_seq=inp.log_seq, digest=inp.digest, reason=inp.reason, problem=inp.problem
        )
    )


def _on_set_policy(ctx: Ctx, inp: T.SetPolicy) -> None:
    problem = set_policy_problem(ctx.state.canonical.policy_params, inp.params)
    if problem:
        return reject(ctx, "invalid_policy", problem)
    ctx.emit(T.PolicyChanged(t=inp.t, params=inp.params, by=inp.by, reason=inp.reason))


FEEDBACK_SCORE_MIN = 1
FEEDBACK_SCORE_MAX = 5
FEEDBACK_COMMENT_CHARS_MAX = 500


def _on_feedback(ctx: Ctx, inp: T.Feedback) -> None:
    c = ctx.state.canonical
    if inp.job not in c.jobs and inp.job not in c.done:
        return reject(ctx, "unknown_job", f"no job {inp.job!r} was submitted; give feedback on one that was")
    if not inp.user:
        return reject(ctx, "user_must_be_set", "feedback is attributed to the user who sends it")
    if not FEEDBACK_SCORE_MIN <= inp.score <= FEEDBACK_SCORE_MAX:
        return reject(ctx, "score_must_be_1_to_5", f"score {inp.score}: 1 (bad) .. 5 (good)")
    if len(inp.comment) > FEEDBACK_COMMENT_CHARS_MAX:
        return reject(
            ctx, "comment_too_long", f"{len(inp.comment)} characters; at most {FEEDBACK_COMMENT_CHARS_MAX}"
        )
    ctx.emit(T.FeedbackRecorded(t=inp.t, job=inp.job, user=inp.user, score=inp.score, comment=inp.comment))


HANDLERS: dict[type, Callable[[Ctx, Any], None]] = {
    T.NodeUp: _on_node_up,
    T.NodeDown: _on_node_down,
    T.Submit: _on_submit,
    T.Cancel: _on_cancel,
    T.Started: _on_started,
    T.CheckpointStarted: _on_checkpoint_started,
    T.CheckpointSaved: _on_checkpoint_saved,
    T.CheckpointFailed: _on_checkpoint_failed,
    T.SafePoint: _on_safe_point,
    T.Released: _on_released,
    T.Finished: _on_finished,
    T.Tick: _on_tick,
    T.SetPolicy: _on_set_policy,
    T.Feedback: _on_feedback,
    T.Hold: _on_hold,
    T.ReleaseHold: _on_release_hold,
    T.Requeue: _on_requeue,
    T.SetLevel: _on_set_level,
    T.SchedulerStart: _on_scheduler_start,
    T.DisownRecord: _on_disown_record,
}
