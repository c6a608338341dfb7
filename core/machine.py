"""`step(state, input) -> (state, records)`: the one entry point of the scheduler, used
live, in replay and in the simulator.

Each input is checked, then decided on (`core.inputs`): decisions emit events, each event
is applied by `evolve` at once and sealed into the hash chain (`core.log.seal`). After the
input's own events comes a scheduling pass (`schedule`): saga deadlines (`core.passes.saga`),
aging (`core.passes.queues`), placement of queued jobs in level and policy order
(`core.passes.placement`), and preemption for blocked jobs that may preempt
(`core.passes.preemption`, deciding with `core.passes.plan`). An input that emits nothing leaves
the state untouched (a quiet tick is not logged at all).
"""

from __future__ import annotations

from .model import types as T
from .model.bounds import input_problem
from .rules.rights import may_preempt
from .identity import identity_problem
from .inputs import HANDLERS, common_problem
from .node_inputs import NODE_HANDLERS
from .log.seal import Ctx, reject
from .passes.placement import place_queued, settle_drain
from .passes.preemption import (
    preempt_blocked,
    preemption_candidates,
    reclaim_blocked,
    reclaim_candidates,
    urgent_candidates,
)
from .passes.queues import age_queued, aging_threshold_ms, downgrades_end_t, restore_levels
from .passes.saga import expire_sagas
from .model.state import State
from .model.entities import QUEUED
from .model.types import LEVELS


# Inputs after which the blocked jobs at the head of the queues are reconsidered for
# preemption. A submit reconsiders only the job it brought; everything else a decision
# depends on (remaining times, checkpoints) drifts slowly, so the periodic tick suffices,
# and the cost of a step stays independent of how many jobs wait.
PREEMPTION_TRIGGERS = (T.Tick, T.SetPolicy)


def new_state(policy=None) -> State:
    """An empty scheduler state (no nodes, no jobs), under `policy` or the default one."""
    state = State()
    if policy is not None:
        state.canonical.policy = policy
    return state


def step(state: State, inp: T.Input, sealed: bool = True) -> tuple[State, list[T.Record]]:
    """Decide on one input: the state, changed in place, and the sealed records of the
    events it led to (an `InputRejected` alone for a bad input; none for a quiet tick).
    `sealed=False` (a simulation that keeps no log) decides the same but hashes nothing:
    the records carry no hash chain (core/log/seal.py)."""
    # The drain hold the step before left pending reads the state that step left.
    settle_drain(state, inp)
    # Bounds first: an input outside them may not even survive normalizing (core/model/bounds.py).
    out_of_bounds = None if isinstance(inp, T.Malformed) else input_problem(inp)
    if out_of_bounds:
        return state, reject_input(state, inp, *out_of_bounds, sealed=sealed)
    inp = T.normalized(inp)
    ctx = Ctx(state, inp, sealed)
    reason = common_problem(state, inp) or identity_problem(state, inp)
    if reason:
        reject(ctx, reason[0], reason[1])
        return state, ctx.records
    # Decisions read the clock from the state: let them see the input's time. Only events
    # move the recorded clock (replay sees nothing else), so an input that led to no event
    # leaves it where it was.
    recorded_t = state.canonical.t
    state.canonical.t = inp.t
    handler = HANDLERS.get(type(inp)) or NODE_HANDLERS[type(inp)]
    handler(ctx, inp)
    if not (ctx.records and isinstance(ctx.records[-1].event, T.InputRejected) and not ctx.accepted):
        if isinstance(inp, PREEMPTION_TRIGGERS):
            schedule(ctx, preempt_for="head")
        elif isinstance(inp, T.Submit):
            schedule(ctx, preempt_for=inp.job)
        else:
            schedule(ctx, preempt_for="")
    if not ctx.records:
        state.canonical.t = recorded_t
    return state, ctx.records


def reject_input(state: State, inp: T.Input, reason: str, detail: str, sealed: bool = True) -> list[T.Record]:
    """Record `inp` as rejected and nothing else: for an input out of bounds, and for a
    caller that could not step one (an exception inside `step`, with the state restored
    to what it was before the input)."""
    ctx = Ctx(state, inp, sealed)
    reject(ctx, reason, detail)
    return ctx.records


def schedule(ctx: Ctx, preempt_for: str) -> None:
    """Deadlines, aging, placement, then preemption: for the blocked jobs at the head of the
    queues (`preempt_for="head"`), for one just-submitted job (its id), or for none ("")."""
    expire_sagas(ctx)
    restore_levels(ctx)
    age_queued(ctx)
    place_queued(ctx, last=not preempt_for or not _plans_after_pass(ctx.state, preempt_for, ctx.inp.t))
    if preempt_for == "head":
        preempt_blocked(
            ctx, urgent_candidates(ctx.state, ctx.inp.t), ctx.state.canonical.policy.urgent_candidates_max
        )
        preempt_blocked(ctx, preemption_candidates(ctx.state, ctx.inp.t))
        reclaim_blocked(ctx, reclaim_candidates(ctx.state, ctx.inp.t))
    elif preempt_for:
        job = ctx.state.canonical.jobs.get(preempt_for)
        if job is None or job.state != QUEUED or job.preempt_retry_t > ctx.inp.t:
            return
        if may_preempt(ctx.state.canonical.policy, job.level):
            preempt_blocked(ctx, [preempt_for])
        if job.state == QUEUED:
            reclaim_blocked(ctx, reclaim_candidates(ctx.state, ctx.inp.t, job.team))


def _plans_after_pass(state: State, preempt_for: str, t: int) -> bool:
    """Whether `schedule` may plan a preemption after the pass (for the blocked jobs at the
    head, or for the submitted job, if it stays queued). When it cannot, nothing decides
    after the pass, so the urgent head's drain hold of a full pool may wait for the next
    step (`place_queued(..., last=True)`): most jobs submitted to a full pool are of levels
    that preempt nothing, and no pass places one (no GPU is free)."""
    if preempt_for == "head":
        return True
    job = state.canonical.jobs.get(preempt_for)
    if job is None or job.state != QUEUED or job.preempt_retry_t > t:
        return False
    p = state.canonical.policy
    return may_preempt(state.canonical.policy, job.level) or (
        p.fair_share_guarantee and p.fair_share_from_level < LEVELS
    )


def next_due_t(state: State) -> int | None:
    """The earliest time at which a tick would change something on its own (an aging step,
    a saga deadline, a downgraded job's level coming back), so a simulator can jump there
    instead of ticking every second."""
    sagas = state.canonical.sagas
    due: list[int] = [min(saga.deadline_t for saga in sagas.values()) + 1] if sagas else []
    if state.index.downgraded_queued:
        restore_t = downgrades_end_t(state)
        if restore_t is not None:
            due.append(restore_t)
    aging_by_level = state.index.aging
    for level in range(1, LEVELS):
        aging = aging_by_level[level]
        if aging:
            due.append(aging[0][0] + aging_threshold_ms(state, level))
    return min(due) if due else None
