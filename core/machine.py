"""`step(state, input) -> (state, records)`: the one entry point of the scheduler, used
live, in replay and in the simulator.

Each input is checked, then decided on: decisions emit events, each event is applied by
`evolve` at once and sealed into the hash chain. After the input's own events comes a
scheduling pass: saga deadlines, aging, placement of queued jobs in level and policy
order, and preemption for blocked jobs that may preempt. An input that emits nothing
leaves the state untouched (a quiet tick is not logged at all).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import re
from typing import Iterable, Iterator

from . import types as T
from .evolve import evolve
from .placement import acceptable_models, free_gpus, node_size_max, place, placement_nodes
from .policy import PolicyError, assign_variant, check_experiment, with_params
from .preemption import (Decline, earliest_fit, expected_runtime_ms, may_preempt, plan_preemption,
                         team_limit)
from .shares import SHARE_EPSILON, above_share, fair_shares, holding, team_quota, within_share
from .state import (
    HOLDING, PREEMPTING, QUEUED, RELEASED, RESERVED, RUNNING, STARTING, Job, State,
    job_progress_ms, last_checkpoint, live_digest, node_free_count, queue_depth,
    window_count,
)
from .types import LEVELS

JOB_ID_LENGTH_MAX = 200
KIND_SUFFIX = re.compile(r"[-_.]?\d+$")
# Inputs after which the blocked jobs at the head of the queues are reconsidered for
# preemption. A submit reconsiders only the job it brought; everything else a decision
# depends on (remaining times, checkpoints) drifts slowly, so the periodic tick suffices,
# and the cost of a step stays independent of how many jobs wait.
PREEMPTION_TRIGGERS = (T.Tick, T.SetPolicy)


class Ctx:
    """Collects the records of one step; every emit applies the event at once."""

    __slots__ = ("state", "inp", "records", "accepted")

    def __init__(self, state: State, inp: T.Input) -> None:
        self.state = state
        self.inp = inp
        self.records: list[T.Record] = []
        self.accepted = False

    def emit(self, ev: T.Event) -> None:
        if not self.accepted and not isinstance(ev, T.InputRejected):
            self.accepted = True
            self._seal(T.InputAccepted(t=self.inp.t, input=self.inp))
        self._seal(ev)

    def _seal(self, ev: T.Event) -> None:
        c = self.state.c
        evolve(self.state, ev)
        data = T.encode(ev)
        prev = c.chain
        n = c.events_n + 1
        digest = hashlib.sha256(prev.encode() + data).hexdigest()
        c.events_n = n
        c.chain = digest
        c.last_input_seq = max(c.last_input_seq, self.inp.seq)
        self.records.append(T.Record(n=n, prev=prev, hash=digest, input_seq=self.inp.seq, event=ev))
        if n % c.policy.digest_every_events == 0 and not isinstance(ev, T.StateDigest):
            self._seal(T.StateDigest(t=c.t, digest=live_digest(self.state), events=n))


def new_state(policy=None) -> State:
    state = State()
    if policy is not None:
        state.c.policy = policy
    return state


def step(state: State, inp: T.Input) -> tuple[State, list[T.Record]]:
    inp = T.normalized(inp)
    ctx = Ctx(state, inp)
    reason = _check_common(state, inp)
    if reason:
        _reject(ctx, reason[0], reason[1])
        return state, ctx.records
    # Decisions read the clock from the state: let them see the input's time. Only events
    # move the recorded clock (replay sees nothing else), so an input that led to no event
    # leaves it where it was.
    recorded_t = state.c.t
    state.c.t = inp.t
    handler = _HANDLERS[type(inp)]
    handler(ctx, inp)
    if not (ctx.records and isinstance(ctx.records[-1].event, T.InputRejected) and not ctx.accepted):
        if isinstance(inp, PREEMPTION_TRIGGERS):
            schedule(ctx, preempt_for="head")
        elif isinstance(inp, T.Submit):
            schedule(ctx, preempt_for=inp.job)
        else:
            schedule(ctx, preempt_for="")
    if not ctx.records:
        state.c.t = recorded_t
    return state, ctx.records


def _check_common(state: State, inp: T.Input) -> tuple[str, str] | None:
    if isinstance(inp, T.Malformed):
        return "malformed_input", inp.error
    if inp.v != T.SCHEMA_VERSION:
        return "unsupported_schema_version", f"v={inp.v}; this scheduler reads v={T.SCHEMA_VERSION}"
    if inp.t < state.c.t:
        return "time_must_not_go_back", f"t={inp.t} is before the last recorded t={state.c.t}"
    if state.c.last_input_seq and 0 < inp.seq <= state.c.last_input_seq:
        return "input_already_applied", f"seq={inp.seq} <= last applied {state.c.last_input_seq}"
    return None


def _reject(ctx: Ctx, reason: str, detail: str = "") -> None:
    inp = ctx.inp
    ctx.emit(T.InputRejected(t=max(inp.t, ctx.state.c.t), reason=reason, detail=detail,
                             input_type=type(inp).__struct_config__.tag, job=T.input_job(inp)))


# ---------------------------------------------------------------- input handlers


def _on_node_up(ctx: Ctx, inp: T.NodeUp) -> None:
    if not inp.node:
        return _reject(ctx, "node_must_be_named")
    if inp.gpus <= 0:
        return _reject(ctx, "gpus_must_be_positive", f"node {inp.node} reported {inp.gpus} GPUs")
    if not inp.gpu_model:
        return _reject(ctx, "gpu_model_must_be_set")
    node = ctx.state.c.nodes.get(inp.node)
    if node is not None and node.up:
        if node.gpus == inp.gpus and node.gpu_model == inp.gpu_model:
            return  # a repeated report: nothing changes, nothing is logged
        return _reject(ctx, "node_already_up_with_other_inventory",
                       f"{inp.node} is up with {node.gpus}x{node.gpu_model}; send node_down first")
    ctx.emit(T.NodeJoined(t=inp.t, node=inp.node, gpu_model=inp.gpu_model, gpus=inp.gpus))


def _on_node_down(ctx: Ctx, inp: T.NodeDown) -> None:
    node = ctx.state.c.nodes.get(inp.node)
    if node is None or not node.up:
        return _reject(ctx, "unknown_node", f"{inp.node} is not up")
    lose_node(ctx, inp.node, inp.reason)


def lose_node(ctx: Ctx, node_name: str, reason: str) -> None:
    c = ctx.state.c
    t = ctx.inp.t
    for saga_id in sorted(c.sagas):
        saga = c.sagas[saga_id]
        touched = any(slot.node == node_name for slot in saga.placement) or any(
            slot.node == node_name for v in saga.victims if v in c.jobs for slot in c.jobs[v].placement)
        if touched:
            rollback(ctx, saga_id, "node_lost", lost_node=node_name)
    jobs = sorted(ctx.state.ix.jobs_by_node.get(node_name, {}))
    for job_id in jobs:
        job = c.jobs[job_id]
        if job.state in HOLDING:
            requeue(ctx, job, "node_lost", counts_as_preemption=False)
    ctx.emit(T.NodeLost(t=t, node=node_name, reason=reason, jobs=jobs))


def _on_submit(ctx: Ctx, inp: T.Submit) -> None:
    c = ctx.state.c
    p = c.policy
    problem = _submit_problem(c, inp)
    if problem:
        return _reject(ctx, *problem)
    level = inp.level
    if c.team_downgraded_until.get(inp.team, 0) > inp.t and level < p.downgrade_applies_below_level \
            and _over_quota(ctx.state, inp.team):
        level = min(LEVELS - 1, level + p.downgrade_levels)
    ctx.emit(T.JobSubmitted(
        t=inp.t, job=inp.job, team=inp.team, user=inp.user, level=level,
        requested_level=inp.level, gpus=inp.gpus, gpu_models=sorted(inp.gpu_models),
        kind=inp.kind or KIND_SUFFIX.sub("", inp.job) or inp.job,
        est_runtime_s=_or(inp.est_runtime_s, p.default_est_runtime_s),
        ckpt_interval_s=_or(inp.ckpt_interval_s, p.default_ckpt_interval_s),
        ckpt_cost_s=_or(inp.ckpt_cost_s, p.default_ckpt_cost_s),
        restore_cost_s=_or(inp.restore_cost_s, p.default_restore_cost_s),
        preemptible=inp.preemptible, command=list(inp.command),
        variant=assign_variant(p, inp.team, inp.job, inp.user)))


def _over_quota(state: State, team: str) -> bool:
    """Whether the team holds more than its fair share of the pool (core/shares.py): a
    downgrade lasts until the team's quota recovers, so a team that preempted often but
    is back within its share is not held down."""
    held = holding(state).get(team, 0)
    return held > 0 and above_share(held, fair_shares(state).get(team, 0.0))


def _or(value: float | None, default: float) -> float:
    return float(default if value is None else value)


def _submit_problem(c, inp: T.Submit) -> tuple[str, str] | None:
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
    if not 0 <= inp.level < LEVELS:
        return "level_must_be_0_to_7", f"got level {inp.level}"
    if inp.gpus <= 0:
        return "gpus_must_be_positive", f"got gpus {inp.gpus}"
    for name in ("est_runtime_s", "ckpt_interval_s", "ckpt_cost_s", "restore_cost_s"):
        value = getattr(inp, name)
        if value is not None and (value < 0 or math.isnan(value) or math.isinf(value)):
            return f"{name}_must_be_non_negative", f"got {name} {value}"
    if inp.est_runtime_s is not None and inp.est_runtime_s == 0:
        return "est_runtime_s_must_be_positive", "leave it out if unknown"
    return None


def _job_or_reject(ctx: Ctx, inp, states: tuple[str, ...]) -> Job | None:
    job = ctx.state.c.jobs.get(inp.job)
    if job is None:
        done = ctx.state.c.done.get(inp.job)
        _reject(ctx, "unknown_job" if done is None else f"job_already_{done}", inp.job)
        return None
    if job.state not in states:
        tag = type(inp).__struct_config__.tag
        _reject(ctx, f"job_is_{job.state}", f"{tag} for {job.id} needs it {' or '.join(states)}")
        return None
    return job


def _on_cancel(ctx: Ctx, inp: T.Cancel) -> None:
    job = _job_or_reject(ctx, inp, (QUEUED, STARTING, RUNNING, RESERVED, PREEMPTING, RELEASED))
    if job is None:
        return
    nodes = placement_nodes(job.placement) if job.state in (STARTING, RUNNING, PREEMPTING) else []
    if job.state == RESERVED:
        rollback(ctx, job.saga, "preemptor_cancelled")
    elif job.state == PREEMPTING:
        release_victim(ctx, job)
    ctx.emit(T.JobCancelled(t=inp.t, job=job.id, nodes=nodes))
    if job.saga and job.saga in ctx.state.c.sagas:
        commit_if_complete(ctx, ctx.state.c.sagas[job.saga].id)


def _on_started(ctx: Ctx, inp: T.Started) -> None:
    job = _job_or_reject(ctx, inp, (STARTING,))
    if job is None:
        return
    ctx.emit(T.JobRunning(t=inp.t, job=job.id, waited_ms=inp.t - job.queued_since_t))


def _on_checkpoint_started(ctx: Ctx, inp: T.CheckpointStarted) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, PREEMPTING))
    if job is not None:
        ctx.emit(T.CheckpointBegan(t=inp.t, job=job.id))


def _on_checkpoint_saved(ctx: Ctx, inp: T.CheckpointSaved) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, PREEMPTING, RELEASED))
    if job is None:
        return
    if not inp.digest:
        return _reject(ctx, "digest_must_be_set", "a checkpoint without a digest cannot be verified")
    if inp.bytes < 0 or inp.step < 0:
        return _reject(ctx, "step_and_bytes_must_be_non_negative")
    # The checkpoint holds the progress made when the save began (training pauses to save).
    at = job.ckpt_started_t or job.frozen_t or inp.t
    progress = job_progress_ms(job, at) if job.state != RELEASED else job.progress_ms
    ctx.emit(T.CheckpointRecorded(t=inp.t, job=job.id, step=inp.step, digest=inp.digest,
                                  bytes=inp.bytes, progress_ms=progress))


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
        return _reject(ctx, "unknown_checkpoint_digest", f"{job.id} has no checkpoint {bad_digest}")
    good = job.checkpoints[index - 1] if index > 0 else None
    lost = job.checkpoints[index].progress_ms - (good.progress_ms if good else 0)
    ctx.emit(T.CheckpointFallback(t=ctx.inp.t, job=job.id, bad_digest=bad_digest,
                                  to_step=good.step if good else 0,
                                  to_digest=good.digest if good else "", lost_progress_ms=lost))


def _on_safe_point(ctx: Ctx, inp: T.SafePoint) -> None:
    job = _job_or_reject(ctx, inp, (PREEMPTING,))
    if job is not None:
        ctx.emit(T.SafePointReached(t=inp.t, job=job.id))


def _on_released(ctx: Ctx, inp: T.Released) -> None:
    job = _job_or_reject(ctx, inp, (PREEMPTING,))
    if job is None:
        return
    saga_id = job.saga
    release_victim(ctx, job)
    commit_if_complete(ctx, saga_id)


def _on_finished(ctx: Ctx, inp: T.Finished) -> None:
    job = _job_or_reject(ctx, inp, (RUNNING, STARTING, PREEMPTING))
    if job is None:
        return
    saga_id = job.saga
    if job.state == PREEMPTING:
        release_victim(ctx, job)
    run_ms = job_progress_ms(job, inp.t)
    nodes = placement_nodes(job.placement)
    if inp.ok:
        ctx.emit(T.JobFinished(t=inp.t, job=job.id, run_ms=run_ms, nodes=nodes))
    else:
        ctx.emit(T.JobFailed(t=inp.t, job=job.id, run_ms=run_ms, reason="exited_with_error", nodes=nodes))
    if saga_id:
        commit_if_complete(ctx, saga_id)


def _on_tick(ctx: Ctx, inp: T.Tick) -> None:
    return None


def _on_set_policy(ctx: Ctx, inp: T.SetPolicy) -> None:
    try:
        new = with_params(ctx.state.c.policy, inp.params)
        if "ab_variants" in inp.params or "ab_split_by" in inp.params:
            check_experiment(new)
    except PolicyError as err:
        return _reject(ctx, "invalid_policy", str(err))
    ctx.emit(T.PolicyChanged(t=inp.t, params=inp.params, by=inp.by, reason=inp.reason))


# ---------------------------------------------------------------- sagas


def release_victim(ctx: Ctx, job: Job) -> None:
    last = last_checkpoint(job)
    progress = job_progress_ms(job, ctx.inp.t)
    lost = progress - (last.progress_ms if last else 0)
    ctx.emit(T.VictimReleased(t=ctx.inp.t, saga=job.saga, job=job.id, lost_progress_ms=lost))


def commit_if_complete(ctx: Ctx, saga_id: str) -> None:
    c = ctx.state.c
    saga = c.sagas.get(saga_id)
    if saga is None:
        return
    pending = [v for v in saga.victims if v in c.jobs and c.jobs[v].state == PREEMPTING]
    if pending:
        return
    t = ctx.inp.t
    ctx.emit(T.PreemptionCommitted(t=t, saga=saga.id, preemptor=saga.preemptor, victims=saga.victims))
    preemptor = c.jobs[saga.preemptor]
    _request_start(ctx, preemptor, saga.placement)
    for victim_id in saga.victims:
        victim = c.jobs.get(victim_id)
        if victim is not None and victim.state == RELEASED:
            requeue(ctx, victim, "preempted", counts_as_preemption=True)


def rollback(ctx: Ctx, saga_id: str, reason: str, lost_node: str = "") -> None:
    c = ctx.state.c
    saga = c.sagas[saga_id]
    t = ctx.inp.t
    ctx.emit(T.PreemptionRolledBack(t=t, saga=saga_id, reason=reason, preemptor=saga.preemptor,
                                    victims=saga.victims))
    for victim_id in saga.victims:
        victim = c.jobs.get(victim_id)
        if victim is None:
            continue
        if victim.state == RUNNING:  # had not released: it keeps running
            ctx.emit(T.NoticeWithdrawn(t=t, saga=saga_id, job=victim_id,
                                       nodes=placement_nodes(victim.placement)))
        elif victim.state == RELEASED and lost_node in placement_nodes(victim.placement):
            requeue(ctx, victim, "node_lost", counts_as_preemption=False)
        elif victim.state == RELEASED:  # gets its own GPUs back, from its fresh checkpoint
            last = last_checkpoint(victim)
            ctx.emit(T.JobResumeRequested(
                t=t, job=victim_id, placement=victim.placement,
                nodes=placement_nodes(victim.placement), ckpt_step=last.step if last else 0,
                ckpt_digest=last.digest if last else "", reason="rolled_back",
                command=victim.command))


def requeue(ctx: Ctx, job: Job, reason: str, counts_as_preemption: bool) -> None:
    c = ctx.state.c
    p = c.policy
    t = ctx.inp.t
    count = job.preempt_count + (1 if counts_as_preemption else 0)
    boost = min(p.requeue_boost_max, p.requeue_boost_per_preemption * count)
    last = last_checkpoint(job)
    lost = job_progress_ms(job, t) - (last.progress_ms if last else 0)
    if counts_as_preemption and count >= p.compensation_after_preemptions:
        boost = min(LEVELS - 1, boost + p.compensation_priority_boost)
        _compensate(ctx, job, count, lost)
    ctx.emit(T.JobRequeued(t=t, job=job.id, boost=boost, reason=reason,
                           lost_progress_ms=max(0, lost), preempt_count=count))


def _compensate(ctx: Ctx, job: Job, count: int, lost_ms: int) -> None:
    p = ctx.state.c.policy
    t = ctx.inp.t
    overhead_ms = job.ckpt_cost_ms + job.restore_cost_ms
    lost_gpu_hours = job.gpus * (max(0, lost_ms) + overhead_ms) / 3_600_000
    grants = [
        ("quota_gpu_hours", round(lost_gpu_hours * p.compensation_quota_gpu_hours_per_lost, 6)),
        ("priority_boost", float(p.compensation_priority_boost)),
        ("fee_credit", round(lost_gpu_hours * p.fee_credit_per_gpu_hour, 6)),
    ]
    for kind, amount in grants:
        ctx.emit(T.CompensationGranted(t=t, job=job.id, team=job.team, kind=kind, amount=amount,
                                       preempt_count=count))


def _request_start(ctx: Ctx, job: Job, placement: list[T.Slot]) -> None:
    nodes = placement_nodes(placement)
    last = last_checkpoint(job)
    if job.resume_pending and last is not None:
        ctx.emit(T.JobResumeRequested(t=ctx.inp.t, job=job.id, placement=placement, nodes=nodes,
                                      ckpt_step=last.step, ckpt_digest=last.digest,
                                      command=job.command))
    else:
        ctx.emit(T.JobStartRequested(t=ctx.inp.t, job=job.id, placement=placement, nodes=nodes,
                                     command=job.command))


# ---------------------------------------------------------------- the scheduling pass


def schedule(ctx: Ctx, preempt_for: str) -> None:
    """Deadlines, aging, placement, then preemption: for the blocked jobs at the head of the
    queues (`preempt_for="head"`), for one just-submitted job (its id), or for none ("")."""
    _expire_sagas(ctx)
    _age(ctx)
    _place_queued(ctx)
    if preempt_for == "head":
        _preempt_for(ctx, preemption_candidates(ctx.state, ctx.inp.t))
        _reclaim_for(ctx, reclaim_candidates(ctx.state, ctx.inp.t))
    elif preempt_for:
        job = ctx.state.c.jobs.get(preempt_for)
        if job is None or job.state != QUEUED or job.preempt_retry_t > ctx.inp.t:
            return
        if may_preempt(ctx.state, job):
            _preempt_for(ctx, [preempt_for])
        if job.state == QUEUED:
            _reclaim_for(ctx, reclaim_candidates(ctx.state, ctx.inp.t, job.team))


def _expire_sagas(ctx: Ctx) -> None:
    c = ctx.state.c
    for saga_id in sorted(c.sagas):
        if c.sagas[saga_id].deadline_t < ctx.inp.t:
            rollback(ctx, saga_id, "deadline_passed")


def aging_threshold_ms(state: State, level: int) -> int:
    """Shrinks as the level's queue deepens and as its historical wait grows."""
    p = state.c.policy
    base = p.aging_threshold_ms[level]
    depth = queue_depth(state.ix, level)
    history = state.c.level_wait[level].mean_ms
    speedup = (1.0 + p.aging_depth_factor * math.log2(1 + depth)
               + p.aging_history_factor * history / max(base, 1))
    return max(p.aging_threshold_min_ms, int(base / speedup))


def _age(ctx: Ctx) -> None:
    state = ctx.state
    t = ctx.inp.t
    for level in range(1, LEVELS):
        aging = state.ix.aging[level]
        if not aging:
            continue
        threshold = aging_threshold_ms(state, level)
        due = []
        for since, job_id in aging:
            if since + threshold > t:
                break
            job = state.c.jobs[job_id]
            if job.level - level < state.c.policy.aging_levels_max:
                due.append(job_id)
        for job_id in due:
            job = state.c.jobs[job_id]
            ctx.emit(T.PriorityAged(t=t, job=job_id, from_level=level, to_level=level - 1,
                                    waited_ms=t - job.queued_since_t))


def queue_order(state: State, level: int, limit: int) -> list[str]:
    """Up to `limit` queued jobs of one level in the order its policy serves them."""
    return list(itertools.islice(serving_order(state, level), max(0, limit)))


def serving_order(state: State, level: int) -> Iterator[str]:
    """The queued jobs of one level, lazily, in the order its policy serves them."""
    live = state.ix.queues[level]
    if not live:
        return iter(())
    # Placing a job removes it from these lists while we iterate: serve from copies of each
    # team's head, which is all a pass can reach within its scan budget.
    depth = state.c.policy.scan_jobs_max
    names = sorted(live)
    teams = {name: live[name][:depth] for name in names}
    policy = state.c.policy.queue_policy[level]
    if policy == "fcfs":
        return (key[-1] for key in heapq.merge(*(teams[name] for name in names)))
    if policy == "fair_share":
        return _fair_share_order(state, teams, names)
    return _round_robin_order(state, level, teams, names)


def _fair_share_order(state: State, teams, names: list[str]) -> Iterator[str]:
    """Next from the team furthest below its quota (GPUs held / quota, counting the jobs
    already offered in this pass), ties to the head of the higher own level and older
    submit, then the team name."""
    c = state.c
    usage: list[list] = []  # [used / quota, head key, name, cursor, used, quota]
    for name in names:
        quota = team_quota(state, name)
        used = state.ix.team_gpus.get(name, 0)
        usage.append([used / quota, teams[name][0][:2], name, 0, used, quota])
    heap = [tuple(entry[:3]) + (i,) for i, entry in enumerate(usage)]
    heapq.heapify(heap)
    while heap:
        _, _, name, i = heapq.heappop(heap)
        entry = usage[i]
        queue = teams[name]
        cursor = entry[3]
        job_id = queue[cursor][-1]
        yield job_id
        entry[3] = cursor + 1
        entry[4] += c.jobs[job_id].gpus
        if entry[3] < len(queue):
            heapq.heappush(heap, (entry[4] / entry[5], queue[entry[3]][:2], name, i))


def _round_robin_order(state: State, level: int, teams, names: list[str]) -> Iterator[str]:
    """One job per team in turn, starting after the team served last at this level."""
    last = state.c.rr_last_team[level]
    start = next((i for i, name in enumerate(names) if name > last), 0)
    rotation = names[start:] + names[:start]
    for rank in itertools.count():
        added = False
        for name in rotation:
            queue = teams[name]
            if rank < len(queue):
                added = True
                yield queue[rank][-1]
        if not added:
            return


def _place_queued(ctx: Ctx) -> None:
    """Start every queued job that fits, level by level in each level's serving order; the
    oldest starving job and the first jobs that do not fit get reservations (EASY backfill:
    later jobs may use reserved nodes only if expected to end before the holder starts)."""
    ix = ctx.state.ix
    if not ix.placement_dirty or not any(ix.free_by_model.values()):
        return
    reserved = _serve_the_starving(ctx)
    ix.reserved_nodes = reserved
    placing = _PlacementPass(ctx, reserved)
    for job_id, reserves in _placement_order(ctx.state):
        if placing.attempts_left <= 0:
            return  # more may fit: the next step goes on (the flag stays set)
        if placing.nothing_more_fits():
            ix.placement_dirty = False
            return
        job = ctx.state.c.jobs[job_id]
        if job.state != QUEUED:
            continue
        placement = placing.try_place(job)
        if placement is not None:
            _request_start(ctx, job, placement)
            placing.took(placement)
        elif reserves:
            placing.maybe_reserve(job)
    ix.placement_dirty = False


def _placement_order(state: State) -> Iterator[tuple[str, bool]]:
    """(job, may get a head reservation), in the order a placement pass tries them: the
    urgent levels' own jobs, then the jobs of teams below their fair shares that fit within
    them, then every level in its serving order. A job aged into the urgent levels from a
    level the guarantee covers is served in that last pass, at its effective level: aging
    bounds a wait within the levels, it does not put a team's flood ahead of the teams
    below their shares. Levels are read lazily, so a job placed earlier in the pass is not
    offered again."""
    p = state.c.policy
    jobs = state.c.jobs
    covered_from = p.fair_share_from_level if p.fair_share_guarantee else LEVELS
    for level in range(min(covered_from, LEVELS)):
        for job_id in serving_order(state, level):
            if jobs[job_id].level < covered_from:
                yield job_id, True
    if covered_from >= LEVELS:
        return
    for job_id in _within_share(state, covered_from):
        yield job_id, False
    for level in range(LEVELS):
        for job_id in serving_order(state, level):
            if jobs[job_id].level >= covered_from:
                yield job_id, True


def _teams_below_share(state: State) -> tuple[dict[str, float], dict[str, int], list[str]]:
    """The fair shares, the GPUs each team holds (see `holding`), and the teams with queued
    jobs that have room for at least one more GPU within their shares, sorted."""
    shares = fair_shares(state)
    held = holding(state)
    below = [team for team in sorted(state.ix.waiting_by_team)
             if within_share(held.get(team, 0), 1, shares.get(team, 0.0))]
    return shares, held, below


def _within_share(state: State, covered_from: int) -> Iterator[str]:
    """Queued jobs (of levels from `covered_from` on) of the teams below their fair shares
    that fit within them: next from the team furthest below its share (GPUs held, with
    what this pass started for it, over its share), each team's oldest jobs first."""
    c = state.c
    shares, held, below = _teams_below_share(state)
    heap = []
    for team in below:
        jobs = [job_id for _, job_id in state.ix.waiting_by_team[team][:TEAM_OLDEST_LOOKED_AT]
                if c.jobs[job_id].level >= covered_from]
        if jobs:
            heap.append((held.get(team, 0) / shares[team], team, jobs))
    heapq.heapify(heap)
    while heap:
        _, team, jobs = heapq.heappop(heap)
        job = c.jobs[jobs.pop(0)]
        if within_share(held.get(team, 0), job.gpus, shares[team]):
            yield job.id
            if job.state != QUEUED:
                held[team] = held.get(team, 0) + job.gpus
        if jobs:
            heapq.heappush(heap, (held.get(team, 0) / shares[team], team, jobs))


class _PlacementPass:
    """The bookkeeping of one placement pass.

    `attempts_left` bounds placement attempts, not jobs looked at: jobs that cannot fit are
    skipped by cheap checks, so a deep layer of blocked gangs at the urgent levels does not
    hide the small jobs behind them while GPUs stand idle. Once only held GPUs are free, the
    pass looks for short jobs to backfill among at most as many jobs (`backfill_left`).

    Placement is monotone within a pass (GPUs only get taken, nodes only get reserved): once
    a gang of `g` GPUs of some models expected to end at `e` did not fit, no gang of the same
    kind with at least `g` GPUs ending at `e` or later will (`blocked`). Blocks that no
    reservation caused hold whatever the end (`ANY_END`)."""

    def __init__(self, ctx: Ctx, reserved: dict[str, tuple[int, str]]) -> None:
        self.state = ctx.state
        self.t = ctx.inp.t
        self.reserved = reserved
        self.starts_by_node = _starts_by_node(reserved)
        self.heads_left = self.state.c.policy.head_reservations_max
        self.attempts_left = self.backfill_left = self.state.c.policy.scan_jobs_max
        self.models_of: dict[tuple[str, ...], list[str]] = {}
        self.blocked: dict[tuple[tuple[str, ...], bool], list[tuple[int, int]]] = {}
        self.free_open = sum(self.state.ix.free_by_model.values())
        self.free_unheld = self.free_open - _free_on(self.state.c, reserved)

    def nothing_more_fits(self) -> bool:
        if self.free_unheld <= 0:
            self.backfill_left -= 1
        return (self.free_open <= 0 or self.backfill_left < 0
                or (1, ANY_END) in self.blocked.get(ANY_MODEL_ONE_NODE, ()))

    def try_place(self, job: Job) -> list[T.Slot] | None:
        state = self.state
        ix = state.ix
        if job.gpus > self.free_open:
            return None
        key = tuple(job.gpu_models)
        models = self.models_of.get(key)
        if models is None:
            models = self.models_of[key] = acceptable_models(job.gpu_models, ix)
        shape = (key, job.gpus > node_size_max(models, ix))
        ends_t = self.t + expected_runtime_ms(state, job)
        if free_gpus(models, ix) < job.gpus or any(
                g <= job.gpus and e <= ends_t for g, e in self.blocked.get(shape, ())):
            return None
        self.attempts_left -= 1
        placement = place(job.gpus, models, state.c.nodes, ix, self.starts_by_node, ends_t)
        if placement is None:
            held = any(ends_t > start_t for start_t in self.starts_by_node.values())
            self.blocked.setdefault(shape, []).append((job.gpus, ends_t if held else ANY_END))
        return placement

    def took(self, placement: list[T.Slot]) -> None:
        self.free_open -= sum(len(slot.gpus) for slot in placement)
        self.free_unheld -= sum(len(slot.gpus) for slot in placement if slot.node not in self.reserved)

    def maybe_reserve(self, job: Job) -> None:
        """The first jobs of the serving order that do not fit get reservations."""
        if self.heads_left > 0 and _reserve(self.state, job, self.reserved):
            self.heads_left -= 1
            self.starts_by_node = _starts_by_node(self.reserved)
            self.free_unheld = self.free_open - _free_on(self.state.c, self.reserved)


def _starts_by_node(reserved: dict[str, tuple[int, str]]) -> dict[str, int]:
    return {name: start_t for name, (start_t, _) in reserved.items()}


def _free_on(c, nodes) -> int:
    return sum(node_free_count(c.nodes[name]) for name in nodes if c.nodes[name].up)


# A one-GPU job that accepts any model and does not fit even ignoring reservations:
# nothing else will either.
ANY_MODEL_ONE_NODE: tuple[tuple[str, ...], bool] = ((), False)
ANY_END = -1


def preemption_candidates(state: State, t: int) -> Iterator[str]:
    """The queued jobs with the strongest right to preempt: by base level (aging and boosts
    change the serving order, never the right to preempt), then submit time; not those
    waiting out a retry backoff. At most `scan_jobs_max` looked at."""
    p = state.c.policy
    scanned = 0
    for level in range(LEVELS):
        if p.preempts_from_level[level] >= LEVELS:
            continue
        for _, job_id in state.ix.waiting_by_level[level]:
            scanned += 1
            if scanned > p.scan_jobs_max:
                return
            if state.c.jobs[job_id].preempt_retry_t <= t:
                yield job_id


def _serve_the_starving(ctx: Ctx) -> dict[str, tuple[int, str]]:
    """The longest-waiting jobs that have waited past `starvation_wait_ms`: start each that
    fits now, else reserve the nodes where it will fit soonest as running jobs end. First
    the oldest of all (any level, any team): new jobs are always younger, so every job in
    time becomes one of the oldest, a finite wait for all. Then the oldest of the teams
    furthest below their quota, so a small team does not wait out a big team's backlog.
    The rest of the pool keeps serving by priority. Returns the reservations
    (node -> (start, job))."""
    state = ctx.state
    p = state.c.policy
    reserved: dict[str, tuple[int, str]] = {}
    served: dict[str, None] = {}
    oldest = (job_id for _, job_id in heapq.merge(*state.ix.waiting_by_level))
    _serve_first_starving(ctx, oldest, p.starvation_reservations_max, reserved, served)
    if p.starvation_team_reservations_max > 0:
        teams = sorted(state.ix.waiting_by_team,
                       key=lambda team: (state.ix.team_gpus.get(team, 0) / team_quota(state, team), team))
        heads = (job_id for team in teams
                 for _, job_id in state.ix.waiting_by_team[team][:TEAM_OLDEST_LOOKED_AT])
        _serve_first_starving(ctx, heads, p.starvation_team_reservations_max, reserved, served)
    return reserved


# Per team, its oldest few queued jobs are looked at: the very oldest may have been requeued
# lately (not starving) or be too big for the pool.
TEAM_OLDEST_LOOKED_AT = 4


def _serve_first_starving(ctx: Ctx, candidates: Iterable[str], count: int,
                          reserved: dict[str, tuple[int, str]], served: dict[str, None]) -> None:
    """Serve the first `count` starving jobs of `candidates` (at most `scan_jobs_max` looked
    at) not served yet: start each that fits, else reserve for it."""
    state = ctx.state
    c = state.c
    p = c.policy
    t = ctx.inp.t
    scanned = 0
    for job_id in candidates:
        scanned += 1
        if count <= 0 or scanned > p.scan_jobs_max:
            return
        job = c.jobs[job_id]
        if job_id in served or job.state != QUEUED or t - job.queued_since_t < p.starvation_wait_ms:
            continue
        models = acceptable_models(job.gpu_models, state.ix)
        if not _could_ever_fit(state, job, models):
            continue
        count -= 1
        served[job_id] = None
        placement = place(job.gpus, models, c.nodes, state.ix, _starts_by_node(reserved),
                          t + expected_runtime_ms(state, job))
        if placement is not None:
            _request_start(ctx, job, placement)
            continue
        _reserve(state, job, reserved)


def _reserve(state: State, job: Job, reserved: dict[str, tuple[int, str]]) -> bool:
    """Hold the nodes where the job will fit soonest (not already held) for it."""
    c = state.c
    models = acceptable_models(job.gpu_models, state.ix)
    if not _could_ever_fit(state, job, models):
        return False
    nodes = [c.nodes[name] for name in sorted(c.nodes)
             if c.nodes[name].up and c.nodes[name].gpu_model in models and name not in reserved]
    fit = earliest_fit(state, job, nodes)
    if fit is None:
        return False
    for name in fit[1]:
        reserved[name] = (c.t + fit[0], job.id)
    return True


def _could_ever_fit(state: State, job: Job, models: list[str]) -> bool:
    """A job bigger than the pool of its models must not hold everyone else back."""
    return job.gpus <= sum(state.ix.capacity_by_model.get(m, 0) for m in models)


def _preempt_for(ctx: Ctx, blocked: Iterable[str]) -> None:
    """Plan preemptions for up to `preemption_candidates_max` of the blocked jobs. Once a
    job finds no eligible victim, no other job of its level will in this step (eligibility
    depends on the preemptor's level only, and sagas only take victims away), so the rest
    of that level and models is skipped without spending an attempt: the attempts go to
    jobs that could preempt, not to the same futile heads every tick. (Nodes held for other
    jobs can make this a little pessimistic for a shorter job; it only orders attempts.)"""
    state = ctx.state
    c = state.c
    attempts_left = c.policy.preemption_candidates_max
    futile: dict[tuple[int, tuple[str, ...]], None] = {}
    for job_id in blocked:
        job = c.jobs.get(job_id)
        if job is None or job.state != QUEUED or (job.level, tuple(job.gpu_models)) in futile:
            continue
        if attempts_left <= 0:
            return
        attempts_left -= 1
        outcome = plan_preemption(state, job)
        if isinstance(outcome, Decline):
            if outcome.reason == "no_eligible_victims":
                futile[(job.level, tuple(job.gpu_models))] = None
            if outcome.reason != job.last_decline:
                ctx.emit(T.PreemptionDeclined(t=ctx.inp.t, job=job_id, reason=outcome.reason,
                                              benefit=outcome.benefit, cost=outcome.cost))
            continue
        _start_saga(ctx, job, outcome)


def reclaim_candidates(state: State, t: int, team_only: str = "") -> Iterator[str]:
    """Per team below its fair share (furthest below first), the oldest of its first few
    queued jobs of the levels the guarantee covers that fits within its share; none while
    no team holds GPUs above its share."""
    p = state.c.policy
    if not p.fair_share_guarantee or p.fair_share_from_level >= LEVELS:
        return
    shares, held, below = _teams_below_share(state)
    lent = sum(max(0.0, held.get(team, 0) - share) for team, share in shares.items())
    if lent < 1:
        return
    for team in sorted(below, key=lambda team: (held.get(team, 0) / shares[team], team)):
        if team_only and team != team_only:
            continue
        for _, job_id in state.ix.waiting_by_team[team][:TEAM_OLDEST_LOOKED_AT]:
            job = state.c.jobs[job_id]
            if job.level >= p.fair_share_from_level \
                    and within_share(held.get(team, 0), job.gpus, shares[team]) \
                    and job.gpus <= lent + SHARE_EPSILON and job.preempt_retry_t <= t:
                yield job_id
                break


def _reclaim_for(ctx: Ctx, candidates: Iterable[str]) -> None:
    """Plan reclaims for up to `preemption_candidates_max` jobs. A declined reclaim is
    recorded only for a job with no right to preempt by priority, so a job tried both ways
    every tick does not record two alternating reasons."""
    state = ctx.state
    c = state.c
    attempts_left = c.policy.preemption_candidates_max
    for job_id in candidates:
        job = c.jobs[job_id]
        if job.state != QUEUED:
            continue
        if attempts_left <= 0:
            return
        attempts_left -= 1
        outcome = plan_preemption(state, job, reclaim=True)
        if isinstance(outcome, Decline):
            if not may_preempt(state, job) and outcome.reason != job.last_decline:
                ctx.emit(T.PreemptionDeclined(t=ctx.inp.t, job=job_id, reason=outcome.reason,
                                              benefit=outcome.benefit, cost=outcome.cost))
            continue
        _start_saga(ctx, job, outcome)


def _start_saga(ctx: Ctx, job: Job, plan) -> None:
    c = ctx.state.c
    p = c.policy
    t = ctx.inp.t
    saga_id = f"saga-{c.saga_count + 1}"
    deadline = t + max(p.deadline_min_ms, plan.ready_ms + p.deadline_slack_ms)
    victim_nodes = sorted(dict.fromkeys(s.node for v in plan.victims for s in c.jobs[v].placement))
    ctx.emit(T.PreemptionPlanned(
        t=t, saga=saga_id, preemptor=job.id, victims=plan.victims, placement=plan.placement,
        deadline_t=deadline, benefit=plan.benefit, cost=plan.cost, reason=plan.reason,
        victim_nodes=victim_nodes, reclaim=plan.reclaim, own_work_counted=False))
    for victim_id in plan.victims:
        victim = c.jobs[victim_id]
        ctx.emit(T.VictimNotified(t=t, saga=saga_id, job=victim_id,
                                  nodes=placement_nodes(victim.placement), deadline_t=deadline,
                                  checkpoint_needed=plan.checkpoint_needed[victim_id]))
    if not plan.reclaim:  # giving back GPUs above a team's share is no unfairness to count
        _fairness_after_plan(ctx, job, plan.victims)


def _fairness_after_plan(ctx: Ctx, preemptor: Job, victims: list[str]) -> None:
    c = ctx.state.c
    p = c.policy
    t = ctx.inp.t
    teams = sorted(dict.fromkeys(c.jobs[v].team for v in victims
                                 if c.jobs[v].team != preemptor.team))
    if not teams:  # the team reordered its own work: nothing counted (see evolve)
        return
    for team in teams:
        win = c.team_windows.get(team)
        count = window_count(win.preempted, t, p.fairness_window_ms) if win else 0
        if count >= team_limit(ctx.state, team, p.team_preempted_max) and c.team_protected_until.get(team, 0) <= t:
            ctx.emit(T.TeamProtected(t=t, team=team, until_t=t + p.team_protect_ms,
                                     preempted_in_window=count))
    win = c.team_windows.get(preemptor.team)
    count = window_count(win.preempting, t, p.fairness_window_ms) if win else 0
    if count >= team_limit(ctx.state, preemptor.team, p.team_preempting_max) \
            and c.team_downgraded_until.get(preemptor.team, 0) <= t:
        ctx.emit(T.TeamDowngraded(t=t, team=preemptor.team, until_t=t + p.team_downgrade_ms,
                                  preempting_in_window=count))


_HANDLERS = {
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
}


def next_due_t(state: State) -> int | None:
    """The earliest time at which a tick would change something on its own (an aging step
    or a saga deadline), so a simulator can jump there instead of ticking every second."""
    c = state.c
    due: list[int] = [saga.deadline_t + 1 for saga in c.sagas.values()]
    for level in range(1, LEVELS):
        aging = state.ix.aging[level]
        if aging:
            due.append(aging[0][0] + aging_threshold_ms(state, level))
    return min(due) if due else None
