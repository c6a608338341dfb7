"""The preemption pass: which blocked jobs get a preemption plan this step (by priority:
the queued jobs of the levels that may preempt, strongest right first, inside a level in
its own queue policy's order (fair share by team at levels 3-5); by reclaim: per team
below its fair share, its oldest job that fits within it), planning each
(`core.passes.plan.plan_preemption`) and starting a saga for each plan, or recording why not.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from ..model import types as T
from ..rules.rights import may_preempt
from ..log.seal import Ctx
from .plan import Decline, plan_preemption
from .queues import TEAM_OLDEST_LOOKED_AT, preempting_order
from .saga import start_saga
from ..rules.shares import lent_gpus, reclaim_refusal, teams_below_share
from ..model.state import State
from ..model.entities import QUEUED
from ..model.types import LEVELS


def preemption_candidates(state: State, t: int) -> Iterator[str]:
    """The queued jobs of the less urgent levels with the strongest right to preempt: by base
    level (aging and boosts change the serving order, never the right to preempt), then in
    the level's own queue policy (`preempting_order`: first come first served, or fair
    share by team quota inside levels 3-5); not those waiting out a retry backoff. At most
    `scan_jobs_max` looked at. (The urgent levels' jobs are `urgent_candidates`, all tried
    on every pass.)"""
    p = state.canonical.policy
    scanned = 0
    for level in range(p.urgent_levels, LEVELS):
        if p.preempts_from_level[level] >= LEVELS:
            continue
        for job_id in preempting_order(state, level):
            scanned += 1
            if scanned > p.scan_jobs_max:
                return
            if state.canonical.jobs[job_id].preempt_retry_t <= t:
                yield job_id


def urgent_candidates(state: State, t: int) -> Iterator[str]:
    """Every queued job of the urgent levels (by base level, then submit time), past its
    retry backoff, at most `urgent_candidates_max`: each is tried on every pass, so an old
    blocked gang does not use up the attempts of the urgent jobs behind it."""
    p = state.canonical.policy
    scanned = 0
    for level in range(min(p.urgent_levels, LEVELS)):
        if p.preempts_from_level[level] >= LEVELS:
            continue
        for _, job_id in state.index.waiting_by_level[level]:
            scanned += 1
            if scanned > p.urgent_candidates_max:
                return
            if state.canonical.jobs[job_id].preempt_retry_t <= t:
                yield job_id


def preempt_blocked(ctx: Ctx, blocked: Iterable[str], attempts_max: int | None = None) -> None:
    """Plan preemptions for up to `preemption_candidates_max` of the blocked jobs. Once a
    job finds no eligible victim, no other job of its level will in this step (eligibility
    depends on the preemptor's level only, and sagas only take victims away), so the rest
    of that level and models is skipped without spending an attempt: the attempts go to
    jobs that could preempt, not to the same futile heads every tick. (Nodes held for other
    jobs can make this a little pessimistic for a shorter job; it only orders attempts.)"""
    state = ctx.state
    c = state.canonical
    attempts_left = c.policy.preemption_candidates_max if attempts_max is None else attempts_max
    futile: dict[tuple[int, tuple[str, ...]], None] = {}
    for job_id in blocked:
        job = c.jobs.get(job_id)
        if job is None or job.state != QUEUED or (job.level, tuple(job.gpu_models)) in futile:
            continue
        if attempts_left <= 0:
            return
        attempts_left -= 1
        outcome = plan_preemption(state, job, known_decline=job.last_decline)
        if isinstance(outcome, Decline):
            if outcome.reason == "no_eligible_victims":
                futile[(job.level, tuple(job.gpu_models))] = None
            if outcome.reason != job.last_decline:
                _record_decline(ctx, job_id, outcome)
            continue
        start_saga(ctx, job, outcome)


def reclaim_candidates(state: State, t: int, team_only: str = "") -> Iterator[str]:
    """Per team below its fair share (furthest below first), the oldest of its first few
    queued jobs of the levels the guarantee covers that fits within its share; none while
    no team holds GPUs above its share."""
    p = state.canonical.policy
    if not p.fair_share_guarantee or p.fair_share_from_level >= LEVELS:
        return
    shares, held, below = teams_below_share(state)
    lent = lent_gpus(shares, held)
    if lent < 1:
        return
    for team in sorted(below, key=lambda team: (held.get(team, 0) / shares[team], team)):
        if team_only and team != team_only:
            continue
        for _, job_id in state.index.waiting_by_team[team][:TEAM_OLDEST_LOOKED_AT]:
            job = state.canonical.jobs[job_id]
            if job.preempt_retry_t <= t and not reclaim_refusal(p, job, shares, held, lent):
                yield job_id
                break


def reclaim_blocked(ctx: Ctx, candidates: Iterable[str]) -> None:
    """Plan reclaims for up to `preemption_candidates_max` jobs. A declined reclaim is
    recorded only for a job with no right to preempt by priority, so a job tried both ways
    every tick does not record two alternating reasons."""
    state = ctx.state
    c = state.canonical
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
            if not may_preempt(state.canonical.policy, job.level) and outcome.reason != job.last_decline:
                _record_decline(ctx, job_id, outcome)
            continue
        start_saga(ctx, job, outcome)


def _record_decline(ctx: Ctx, job_id: str, outcome: Decline) -> None:
    ctx.emit(
        T.PreemptionDeclined(
            t=ctx.inp.t, job=job_id, reason=outcome.reason, benefit=outcome.benefit, cost=outcome.cost
        )
    )
