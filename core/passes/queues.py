"""The queues: in what order each level serves its queued jobs (`fcfs`, `fair_share` by
team quota over what teams hold at that level, `round_robin`: the level's own policy),
aging, which moves a job that waited past its level's threshold one level up (the threshold
shrinks as the queue deepens and as the level's historical wait grows), so every wait
within the levels is bounded, and the return of downgraded jobs to their level.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from typing import Iterator

from ..model import types as T
from ..log.seal import Ctx
from ..rules.fairness import team_downgrade_ends_t
from ..rules.shares import level_share_used, level_used_gpus, team_quota
from ..model.state import State, queue_depth
from ..model.types import LEVELS


# Per team, its oldest few queued jobs are looked at: the very oldest may have been requeued
# lately (not starving) or be too big for the pool.
TEAM_OLDEST_LOOKED_AT = 4


def aging_threshold_ms(state: State, level: int) -> int:
    """Shrinks as the level's queue deepens and as its historical wait grows. Memoised in
    the index per level while the policy, the level's wait history (replaced, never changed
    in place) and its queue depth stay the same: every step asks for it."""
    p = state.canonical.policy
    depth = queue_depth(state.index, level)
    wait = state.canonical.level_wait[level]
    memo = state.scratch.aging_memo[level]
    if memo is not None and memo[0] is p and memo[1] is wait and memo[2] == depth:
        return memo[3]
    threshold = _aging_threshold_ms(p, level, depth, wait.mean_ms)
    state.scratch.aging_memo[level] = (p, wait, depth, threshold)
    return threshold


def _aging_threshold_ms(p, level: int, depth: int, history: float) -> int:
    base = p.aging_threshold_ms[level]
    speedup = (
        1.0 + p.aging_depth_factor * math.log2(1 + depth) + p.aging_history_factor * history / max(base, 1)
    )
    return max(p.aging_threshold_min_ms, int(base / speedup))


def age_queued(ctx: Ctx) -> None:
    """Move each job that has waited past its level's aging threshold one level up
    (`PriorityAged`), up to `aging_levels_max` levels above its own."""
    state = ctx.state
    t = ctx.inp.t
    for level in range(1, LEVELS):
        aging = state.index.aging[level]
        if not aging:
            continue
        threshold = aging_threshold_ms(state, level)
        due = []
        for since, job_id in aging:
            if since + threshold > t:
                break
            job = state.canonical.jobs[job_id]
            if job.level - level < state.canonical.policy.aging_levels_max:
                due.append(job_id)
        for job_id in due:
            job = state.canonical.jobs[job_id]
            ctx.emit(
                T.PriorityAged(
                    t=t, job=job_id, from_level=level, to_level=level - 1, waited_ms=t - job.queued_since_t
                )
            )


def restore_levels(ctx: Ctx) -> None:
    """Queued jobs that entered below their requested level under a team downgrade go back
    to it once the team's preemption quota has recovered (or, with the operator's opt-in
    `downgraded_wait_max_ms`, once the job has waited that long): a downgrade bounds a
    team's preempting; it does not keep an urgent job waiting longer than it lasts."""
    ix = ctx.state.index
    if not ix.downgraded_queued:
        return
    c = ctx.state.canonical
    t = ctx.inp.t
    for job_id in sorted(ix.downgraded_queued):
        job = c.jobs[job_id]
        if downgrade_ends_t(ctx.state, job) <= t:
            ctx.emit(
                T.JobLevelRestored(
                    t=t, job=job_id, level=job.requested_level, waited_ms=t - job.queued_since_t
                )
            )


def downgrade_ends_t(state: State, job) -> int:
    """When a downgraded queued job gets its requested level back: when its team's quota
    recovers (re-read on every pass: see `team_downgrade_ends_t`), or after `downgraded_wait_max_ms` of waiting when the policy bounds it."""
    c = state.canonical
    ends = team_downgrade_ends_t(state, job.team)
    bound = c.policy.downgraded_wait_max_ms
    return min(ends, job.queued_since_t + bound) if bound else ends


def downgrades_end_t(state: State) -> int | None:
    """When the first downgrade holding a queued job's level down ends, if any does."""
    c = state.canonical
    ends = [downgrade_ends_t(state, c.jobs[job_id]) for job_id in state.index.downgraded_queued]
    return min(ends) if ends else None


def queue_order(state: State, level: int, limit: int) -> list[str]:
    """Up to `limit` queued jobs of one level in the order its policy serves them."""
    return list(itertools.islice(serving_order(state, level), max(0, limit)))


def serving_order(state: State, level: int) -> Iterator[str]:
    """The queued jobs of one level, lazily, in the order its policy serves them."""
    live = state.index.queues[level]
    if not live:
        return iter(())
    teams, names = _team_heads(state, live)
    return _by_own_level(state, level, teams, names)


def serving_count(state: State, level: int) -> int:
    """How many jobs `serving_order(state, level)` yields as the index stands: each team's
    queue head as deep as `_team_heads` copies it."""
    depth = state.canonical.policy.scan_jobs_max
    return sum(min(len(queue), depth) for queue in state.index.queues[level].values())


def preempting_order(state: State, level: int) -> Iterator[str]:
    """The queued jobs of one base level, wherever aging or a boost queues them, in the order
    of the level's own queue policy: who of the level takes GPUs by preemption first. Fair
    share decides who gets a level's next GPUs whether a release or a preemption frees them
    (levels 3-5: the team furthest below its quota inside the level first), so a team's
    backlog of old jobs does not take every GPU the level preempts while another team of
    the level, further below its quota, waits."""
    live = state.index.waiting_by_level_team[level]
    if not live:
        return iter(())
    teams, names = _team_heads(state, live)
    return _order(state, level, state.canonical.policy.queue_policy[level], teams, names)


def _team_heads(state: State, live) -> tuple[dict[str, list[str]], list[str]]:
    """Copies of each team's queue head, as deep as a pass's scan budget reaches, and the team
    names in order. Placing a job removes it from the live lists while a pass iterates, so the
    orders serve from these copies."""
    depth = state.canonical.policy.scan_jobs_max
    names = sorted(live)
    return {name: live[name][:depth] for name in names}, names


def _by_own_level(state: State, level: int, teams, names: list[str]) -> Iterator[str]:
    """The jobs that belong to the level first, in its policy's order; then each group of
    jobs aged (or boosted) into it from a less urgent level, in the order of the policy of
    the level they belong to: aging moves a job ahead of the less urgent levels, it does
    not change how it is weighed against its own level's other jobs (a team's aged level-4
    jobs are served by fair share inside level 4 wherever they queue). A team's queue is
    sorted by its jobs' own level first (`queue_key`), so each group is one slice of it."""
    # Chained in C: a pass reads thousands of jobs through here. Each group's order starts
    # only when the group before it is used up, as it reads the index at that moment.
    return itertools.chain.from_iterable(_own_level_groups(state, level, teams, names))


def _own_level_groups(state: State, level: int, teams, names: list[str]) -> Iterator[Iterator[str]]:
    policies = state.canonical.policy.queue_policy
    # Own level -> team -> its jobs of that own level (teams in name order). A team's
    # queue is this pass's own copy, sorted by own level: mostly of one level, used whole.
    groups: dict[int, dict[str, list]] = {}
    for name in names:
        queue = teams[name]
        if not queue:
            continue
        if queue[0][0] == queue[-1][0]:
            groups.setdefault(queue[0][0], {})[name] = queue
            continue
        lo = 0
        while lo < len(queue):
            own = queue[lo][0]
            hi = bisect.bisect_left(queue, (own + 1,), lo)
            groups.setdefault(own, {})[name] = queue[lo:hi]
            lo = hi
    for own in range(LEVELS):
        group = groups.get(own)
        if group:
            yield _order(state, level, policies[own], group, list(group))


def _order(state: State, level: int, policy: str, teams, names: list[str]) -> Iterator[str]:
    if policy == "fcfs":
        return (key[-1] for key in heapq.merge(*(teams[name] for name in names)))
    if policy == "fair_share":
        return _fair_share_order(state, level, teams, names)
    return _round_robin_order(state, level, teams, names)


def _fair_share_order(state: State, level: int, teams, names: list[str]) -> Iterator[str]:
    """Next from the team furthest below its quota inside the level (GPUs its jobs of this
    level hold / quota, counting the jobs already offered in this pass, and with a half-life
    the GPUs the team held there lately: `level_share_used`): fair share decides
    who gets the level's next GPUs, whatever the teams hold at other levels), ties to the
    older submit, then the team name. Jobs aged into the level queue behind the jobs that
    belong there, as at the first-come-first-served levels, and among themselves by the same
    fair share inside their own level: a team's aged job is weighed by what the team holds
    at the level the job belongs to."""
    c = state.canonical
    p = c.policy
    held = state.index.level_team_gpus
    quotas = {name: team_quota(state, name) for name in names}
    offered: dict[tuple[str, int], int] = {}
    lately: dict[tuple[str, int], float] = {}  # GPUs held on average lately (with a half-life)
    decays = p.fair_share_half_life_s > 0

    def entry(name: str, cursor: int) -> tuple:
        queued = teams[name][cursor]
        own_level = queued[0]
        key = (name, own_level)
        used = held[own_level].get(name, 0) + offered.get(key, 0)
        if decays and key not in lately:
            lately[key] = level_used_gpus(state, own_level, name)
        standing, _ = level_share_used(p, used, lately.get(key, 0.0), quotas[name])
        return (own_level, standing, queued[1], name, cursor)

    heap = [entry(name, 0) for name in names]
    heapq.heapify(heap)
    jobs = c.jobs
    heappop, heappush = heapq.heappop, heapq.heappush
    while heap:
        own_level, _, _, name, cursor = heappop(heap)
        queue = teams[name]
        job_id = queue[cursor][-1]
        yield job_id
        key = (name, own_level)
        offered[key] = offered.get(key, 0) + jobs[job_id].gpus
        if cursor + 1 < len(queue):
            heappush(heap, entry(name, cursor + 1))


def _round_robin_order(state: State, level: int, teams, names: list[str]) -> Iterator[str]:
    """One job per team in turn, starting after the team served last at this level."""
    last = state.canonical.rr_last_team[level]
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
