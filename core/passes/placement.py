"""The placement pass: start every queued job that fits, in the order the levels serve them
(the urgent levels, then the teams below their fair shares, then every level), with EASY
backfill: the longest-starving jobs and the first jobs that do not fit reserve the nodes
where they will fit soonest, and later jobs may use those nodes only if expected to end
before the holder starts. `request_start` asks hosts to start (or resume) a job.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Iterable, Iterator

from ..model import types as T
from .drain import drain_fit
from ..rules.guarantees import level_floors
from ..rules.substitutes import substitute_placement
from ..forecast.waits import earliest_fit
from ..rules.holds import backfill_view, binding_holds, may_hold_as_head
from ..log.seal import Ctx
from ..model.policy import FAIR_SHARE
from ..model import placement as P
from ..model.placement import acceptable_models, free_gpus, node_size_max, place, placement_nodes
from .queues import TEAM_OLDEST_LOOKED_AT, aging_threshold_ms, serving_count, serving_order
from ..rules.shares import team_quota, teams_below_share, within_share
from ..model.state import State
from ..model.cordon import takes_work
from ..model.up_nodes import UpNodes
from ..model.entities import QUEUED, Job, last_checkpoint, node_free_count
from ..model.types import LEVELS

# A one-GPU job that accepts any model and does not fit even ignoring reservations:
# nothing else will either.
ANY_MODEL_ONE_NODE: tuple[tuple[str, ...], bool, int, int] = ((), False, -1, 0)
ANY_END = -1  # a block that no reservation caused: it holds whatever the job's end


def request_start(ctx: Ctx, job: Job, placement: list[T.Slot]) -> None:
    """Ask hosts to start the job on `placement`: resume from its last checkpoint when it has
    run before, else from scratch."""
    nodes = placement_nodes(placement)
    last = last_checkpoint(job)
    run: dict[str, Any] = {
        "t": ctx.inp.t,
        "job": job.id,
        "placement": placement,
        "nodes": nodes,
        "command": job.command,
    }
    run.update(P.run_details(ctx.state.canonical, job, nodes))
    if job.resume_pending and last is not None:
        resume_from: dict[str, Any] = {"ckpt_step": last.step, "ckpt_digest": last.digest}
        ctx.emit(T.JobResumeRequested(**run, **resume_from, resume_points=P.resume_points(job)))
    else:
        ctx.emit(T.JobStartRequested(**run))


def place_queued(ctx: Ctx, last: bool = False) -> None:
    """Start every queued job that fits, level by level in each level's serving order; the
    oldest starving job and the first jobs that do not fit get reservations (EASY backfill:
    later jobs may use reserved nodes only if expected to end before the holder starts).
    `last`: nothing else in this step decides after the pass (no preemption planning), so
    the urgent head's drain hold of a full pool may wait for the next step
    (`settle_drain`)."""
    ix = ctx.state.index
    sx = ctx.state.scratch
    if not sx.placement_dirty:
        return
    if not any(ix.free_by_model.values()):
        # A hold still pending is superseded here (`settle_drain`): made afresh, now or later.
        sx.drain_pending_t = ctx.state.canonical.t if last else -1
        if not last:
            _drain_for_the_urgent_head(ctx.state)
        return
    reserved = _serve_the_starving(ctx)
    sx.reserved_nodes = reserved
    sx.drain_pending_t = -1  # (none can be: `settle_drain` ran at the step's start)
    placing = _PlacementPass(ctx, reserved)
    jobs = ctx.state.canonical.jobs
    for job_id, reserves in _placement_order(ctx.state, placing.passes_over):
        if placing.attempts_left <= 0:
            return  # more may fit: the next step goes on (the flag stays set)
        if placing.nothing_more_fits():
            sx.placement_dirty = False
            return
        job = jobs[job_id]
        if job.state != QUEUED:
            continue
        # (A job larger than the free GPUs is not tried: most of a deep queue, every pass.)
        placement = placing.try_place(job) if job.gpus <= placing.free_open else None
        if placement is not None:
            request_start(ctx, job, placement)
            placing.took(placement)
        elif reserves and placing.heads_left > 0:
            placing.maybe_reserve(job)
    sx.placement_dirty = False


# Inputs whose events change nothing a full pool's drain reads but a job's own checkpoint
# fields and progress (no queue, holder, level or policy changes; a tick has no events of
# its own): after one, while nothing falls due, its pass makes the same head's hold afresh
# over the same other holds before anything reads them.
DRAIN_SUPERSEDED_BY = (T.CheckpointStarted, T.CheckpointSaved, T.Tick)


def settle_drain(state: State, inp: T.Input) -> None:
    """At a step's start: work out the drain hold the step before left pending
    (`place_queued(..., last=True)`), from the state that step left, at its time, unless this
    step supersedes it. While the pool stays full, most steps are hosts' checkpoint reports
    that only reach the drain: the hold of the head is made at every pass, and each pass's
    hold replaces the one before (the other holds are kept, filtered by who still queues),
    so only the last one before something else reads or changes them is needed. A
    checkpoint report or a tick supersedes the pending hold when, at its time, no saga deadline,
    aging step or downgrade's end falls due (its pass then reaches the drain with the same
    head, the same queued jobs and the same free GPUs) and the urgent levels' serving order
    does not read the clock (no fair-share level: quotas' time-limited bonuses); rejected,
    it changes nothing the hold reads, and the hold stays pending."""
    sx = state.scratch
    if sx.drain_pending_t < 0:
        return
    if type(inp) in DRAIN_SUPERSEDED_BY and _quiet_at(state, inp.t):
        return
    _settle(state)


def reserved_nodes(state: State) -> dict[str, tuple[int, str]]:
    """The holds of the last pass (node -> (expected start, job)), the pending drain hold
    worked out: what a reader outside `step` must use instead of `Scratch.reserved_nodes`."""
    if state.scratch.drain_pending_t >= 0:
        _settle(state)
    return state.scratch.reserved_nodes


def _settle(state: State) -> None:
    c = state.canonical
    sx = state.scratch
    now = c.t
    c.t = sx.drain_pending_t
    sx.drain_pending_t = -1
    try:
        _drain_for_the_urgent_head(state)
    finally:
        c.t = now


def _quiet_at(state: State, t: int) -> bool:
    """Whether a pass at `t` over this state would roll back no saga, restore no downgraded
    job's level and age no job (what `schedule` does before placing), and the urgent
    levels' serving order does not depend on the clock."""
    c = state.canonical
    ix = state.index
    if ix.downgraded_queued:
        return False
    urgent = min(c.policy.urgent_levels, LEVELS)
    if FAIR_SHARE in c.policy.queue_policy[:urgent]:
        return False
    if any(saga.deadline_t < t for saga in c.sagas.values()):
        return False
    for level in range(1, LEVELS):
        aging = ix.aging[level]
        if aging and aging[0][0] + aging_threshold_ms(state, level) <= t:
            return False
    return True


def _drain_for_the_urgent_head(state: State) -> None:
    """With no GPU free there is nothing to place, but the first urgent gang in serving
    order still gets its hold (the node to drain: core/passes/drain.py): a full pool is just where
    every node mixes work it cannot preempt with work it can, and without the hold what
    that work lets go is taken at once by whatever queues behind. A one-GPU job needs no
    drained node (any one victim frees it a GPU). The other reservations stay as the last
    pass made them."""
    c = state.canonical
    sx = state.scratch
    head = next(
        (
            job_id
            for level in range(min(c.policy.urgent_levels, LEVELS))
            for job_id in serving_order(state, level)
            if c.jobs[job_id].gpus > 1 and may_hold_as_head(c.policy, c.jobs[job_id])[0]
        ),
        None,
    )
    if head is None or c.policy.head_reservations_max <= 0:
        return
    # The head's own hold is made afresh (its last decision may have changed where it
    # waits best); holds of jobs no longer queued are dropped.
    reserved = {
        name: held
        for name, held in sx.reserved_nodes.items()
        if held[1] != head and held[1] in c.jobs and c.jobs[held[1]].state == QUEUED
    }
    _reserve(state, c.jobs[head], reserved)
    sx.reserved_nodes = reserved


def _placement_order(state: State, passes_over=None) -> Iterator[tuple[str, bool]]:
    """(job, may get a head reservation), in the order a placement pass tries them: first
    the levels below their guaranteed shares, up to them; then, by default, every level in
    order 0 -> 7, each in its own serving order (the model: levels in order, each by its
    queue policy). With the opt-in cross-pool guarantee (`fair_share_guarantee`): the urgent
    levels' own jobs, then the jobs of teams below their fair shares that fit within them,
    then every level in its serving order; a job aged into the urgent levels from a level
    the guarantee covers is served in that last pass, at its effective level. Levels are
    read lazily, so a job placed earlier in the pass is not offered again. `passes_over(level)`
    (`_PlacementPass.passes_over`): whether a level of the default order may be passed over
    whole, as it stands when its turn comes."""
    p = state.canonical.policy
    jobs = state.canonical.jobs
    yield from _below_guarantee(state)
    covered_from = p.fair_share_from_level if p.fair_share_guarantee else LEVELS
    if covered_from >= LEVELS:
        # Every job's own level is below LEVELS (inputs are checked): no filter to apply.
        for level in range(LEVELS):
            if passes_over is None or not passes_over(level):
                yield from zip(serving_order(state, level), itertools.repeat(True))
        return
    for level in range(covered_from):
        for job_id in serving_order(state, level):
            if jobs[job_id].level < covered_from:
                yield job_id, True
    for job_id in _within_share(state, covered_from):
        yield job_id, False
    for level in range(LEVELS):
        for job_id in serving_order(state, level):
            if jobs[job_id].level >= covered_from:
                yield job_id, True


def _below_guarantee(state: State) -> Iterator[tuple[str, bool]]:
    """Jobs of the levels holding less than their guaranteed share (whole GPUs) that fit
    within it, each level in its serving order: a guarantee is kept by placement, not only
    by sparing the level from preemption."""
    ix = state.index
    floors = level_floors(state.canonical.policy, ix.total_gpus)
    for level in range(LEVELS):
        if not floors[level] or ix.level_gpus[level] >= floors[level] or not ix.queues[level]:
            continue
        for job_id in serving_order(state, level):
            job = state.canonical.jobs[job_id]
            if job.level == level and ix.level_gpus[level] + job.gpus <= floors[level]:
                yield job_id, False
            if ix.level_gpus[level] >= floors[level]:
                break


def _within_share(state: State, covered_from: int) -> Iterator[str]:
    """Queued jobs (of levels from `covered_from` on) of the teams below their fair shares
    that fit within them: next from the team furthest below its share (GPUs held, with
    what this pass started for it, over its share), each team's oldest jobs first."""
    c = state.canonical
    shares, held, below = teams_below_share(state)
    heap = []
    for team in below:
        jobs = [
            job_id
            for _, job_id in state.index.waiting_by_team[team][:TEAM_OLDEST_LOOKED_AT]
            if c.jobs[job_id].level >= covered_from
        ]
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
        self.heads_left = self.state.canonical.policy.head_reservations_max
        self.urgent_levels = self.state.canonical.policy.urgent_levels
        self.attempts_left = self.backfill_left = self.state.canonical.policy.scan_jobs_max
        # Per job's model list: the models it accepts and their largest node.
        self.models_of: dict[tuple[str, ...], tuple[list[str], int]] = {}
        self.blocked: dict[tuple[tuple[str, ...], bool, int, int], list[tuple[int, int]]] = {}
        self.free_open = sum(self.state.index.free_by_model.values())
        self.free_unheld = self.free_open - _free_on(self.state.canonical, reserved)

    def nothing_more_fits(self) -> bool:
        if self.free_unheld <= 0:
            self.backfill_left -= 1
        return self.backfill_left < 0 or self.nothing_more_fits_now()

    def passes_over(self, level: int) -> bool:
        """Whether the pass may skip the level's queued jobs unread: every one is larger than
        the free GPUs and no head reservation is left to make, so each would only be counted
        against the backfill budget (`nothing_more_fits`), which this does for them, in one
        sum, when it cannot run out on the way (else they are read one by one, as always).
        The same pass: a full pool's deep queues of gangs are not walked job by job."""
        ix = self.state.index
        sizes = ix.queued_gpus_by_level_size[level]
        if (
            not sizes
            or self.heads_left > 0
            or self.attempts_left <= 0
            or min(sizes) <= self.free_open
            or self.nothing_more_fits_now()
        ):
            return False
        if self.free_unheld > 0:
            return True
        offered = serving_count(self.state, level)
        if self.backfill_left - offered < 0:
            return False
        self.backfill_left -= offered
        return True

    def nothing_more_fits_now(self) -> bool:
        return self.free_open <= 0 or (1, ANY_END) in self.blocked.get(ANY_MODEL_ONE_NODE, ())

    def try_place(self, job: Job) -> list[T.Slot] | None:
        """A placement on the job's own models or, when the policy lists compatible models
        and it pays, on one of those (core/rules/substitutes.py). For a job no larger than the free
        GPUs (`place_queued` checks that first)."""
        placement = self._place_own(job)
        if placement is None and self.state.canonical.policy.gpu_substitutes:
            placement = substitute_placement(self.state, job, self.starts_by_node)
        return placement

    def _place_own(self, job: Job) -> list[T.Slot] | None:
        state = self.state
        ix = state.index
        key = tuple(job.gpu_models)
        known = self.models_of.get(key)
        if known is None:
            models = acceptable_models(job.gpu_models, ix)
            known = self.models_of[key] = (models, node_size_max(models, ix))
        models, size_max = known
        if free_gpus(models, ix) < job.gpus:
            return None
        # (Most jobs are of a level no hold spares: `_starts_for` would give them all holds.)
        if job.level >= self.urgent_levels or not self.reserved:
            starts = self.starts_by_node
        else:
            starts = self._starts_for(job)
        starts, ends_t, shift = backfill_view(state, job, self.t, starts, self.reserved)
        # Jobs that see other holds (an urgent level, or shifted starts: core/rules/holds.py)
        # are blocked apart.
        shape = (key, job.gpus > size_max, job.level if starts is not self.starts_by_node else -1, shift)
        blocked = self.blocked.get(shape)
        if blocked and any(g <= job.gpus and e <= ends_t for g, e in blocked):
            return None
        self.attempts_left -= 1
        placement = place(job.gpus, models, state.canonical.nodes, ix, starts, ends_t)
        if placement is None:
            held = any(ends_t > start_t for start_t in starts.values())
            self.blocked.setdefault(shape, []).append((job.gpus, ends_t if held else ANY_END))
        return placement

    def _starts_for(self, job: Job) -> dict[str, int]:
        """The holds that bind `job` (node -> expected start): all of them, but for an
        urgent job those of holders its level may preempt (core/rules/holds.py)."""
        if job.level >= self.state.canonical.policy.urgent_levels or not self.reserved:
            return self.starts_by_node
        binding = binding_holds(self.state, job, self.reserved)
        if len(binding) == len(self.reserved):
            return self.starts_by_node
        return _starts_by_node(binding)

    def took(self, placement: list[T.Slot]) -> None:
        self.free_open -= sum(len(slot.gpus) for slot in placement)
        self.free_unheld -= sum(len(slot.gpus) for slot in placement if slot.node not in self.reserved)

    def maybe_reserve(self, job: Job) -> None:
        """The first jobs of the serving order that do not fit get reservations, while
        `heads_left` (`place_queued` checks it first)."""
        if may_hold_as_head(self.state.canonical.policy, job)[0] and _reserve(self.state, job, self.reserved):
            self.heads_left -= 1
            self.starts_by_node = _starts_by_node(self.reserved)
            self.free_unheld = self.free_open - _free_on(self.state.canonical, self.reserved)


def _starts_by_node(reserved: dict[str, tuple[int, str]]) -> dict[str, int]:
    return {name: start_t for name, (start_t, _) in reserved.items()}


def _free_on(c, nodes) -> int:
    return sum(node_free_count(c.nodes[name]) for name in nodes if takes_work(c.nodes[name]))


def _serve_the_starving(ctx: Ctx) -> dict[str, tuple[int, str]]:
    """The longest-waiting jobs that have waited past `starvation_wait_ms`: start each that
    fits now, else reserve the nodes where it will fit soonest as running jobs end. First
    the oldest of all (any level, any team): new jobs are always younger, so every job in
    time becomes one of the oldest, a finite wait for all. Then the oldest of the teams
    furthest below their quota, so a small team does not wait out a big team's backlog.
    The rest of the pool keeps serving by priority. Returns the reservations
    (node -> (start, job))."""
    state = ctx.state
    p = state.canonical.policy
    reserved: dict[str, tuple[int, str]] = {}
    served: dict[str, None] = {}
    oldest = (job_id for _, job_id in heapq.merge(*state.index.waiting_by_level))
    _serve_first_starving(ctx, oldest, p.starvation_reservations_max, reserved, served)
    if p.starvation_team_reservations_max > 0:
        teams = sorted(
            state.index.waiting_by_team,
            key=lambda team: (state.index.team_gpus.get(team, 0) / team_quota(state, team), team),
        )
        heads = (
            job_id
            for team in teams
            for _, job_id in state.index.waiting_by_team[team][:TEAM_OLDEST_LOOKED_AT]
        )
        _serve_first_starving(ctx, heads, p.starvation_team_reservations_max, reserved, served)
    return reserved


def _serve_first_starving(
    ctx: Ctx,
    candidates: Iterable[str],
    count: int,
    reserved: dict[str, tuple[int, str]],
    served: dict[str, None],
) -> None:
    """Serve the first `count` starving jobs of `candidates` (at most `scan_jobs_max` looked
    at) not served yet: start each that fits, else reserve for it."""
    state = ctx.state
    c = state.canonical
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
        models = acceptable_models(job.gpu_models, state.index)
        if not _could_ever_fit(state, job, models):
            continue
        count -= 1
        served[job_id] = None
        starts, ends_t, _ = backfill_view(state, job, t, _starts_by_node(reserved), reserved)
        placement = place(job.gpus, models, c.nodes, state.index, starts, ends_t)
        if placement is not None:
            request_start(ctx, job, placement)
            continue
        _reserve(state, job, reserved)


def _reserve(state: State, job: Job, reserved: dict[str, tuple[int, str]]) -> bool:
    """Hold the nodes where the job will fit soonest (not already held) for it."""
    c = state.canonical
    models = acceptable_models(job.gpu_models, state.index)
    if not _could_ever_fit(state, job, models):
        return False
    nodes = UpNodes(state, models, reserved)
    fit = None
    if job.level < c.policy.urgent_levels and job.gpus <= node_size_max(models, state.index):
        fit = drain_fit(state, job, nodes)  # the node its unpreemptible neighbours leave first
    if fit is None:
        fit = earliest_fit(state, job, nodes)
    if fit is None:
        return False
    for name in fit[1]:
        reserved[name] = (c.t + fit[0], job.id)
    return True


def _could_ever_fit(state: State, job: Job, models: list[str]) -> bool:
    """A job bigger than the pool of its models must not hold everyone else back."""
    return job.gpus <= sum(state.index.capacity_by_model.get(m, 0) for m in models)
