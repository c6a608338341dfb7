"""Forecasts from the running jobs: a job's expected runtime and remaining time (learned
per team and kind, Lindy beyond the estimate; core/forecast/release.py, re-exported here), when each node's GPUs will be released,
the earliest time a gang would fit without preempting, a queued job's natural wait (its
fit, after the GPUs that jobs served before it take), and how long a victim takes to
reach a safe point. Memoised in the scratch for the current time (see `Scratch`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable

from .fit_order import ordered_single_fit
from .node_fit import earliest_single_fit
from .release_pool import TURNOVER_SCALE_BITS, ReleasePool, fresh_pool, grid_time, kept_pool
from ..model.policy import Policy
from .release import LINDY_FLOOR_FRACTION as LINDY_FLOOR_FRACTION  # re-exported (X as X)
from .release import expected_runtime_ms as expected_runtime_ms
from .release import release_spec as release_spec
from .release import remaining_at as remaining_at
from .release import remaining_ms as remaining_ms
from .release import holder_specs
from ..model.state import State
from ..model.entities import Job, node_free_count, queue_key
from ..model.up_nodes import UpNodes, nodes_key, size_max


def safe_point_ms(state: State, p: Policy) -> int:
    """How long a victim takes from the notice to its safe point: the victims' mean once
    enough have shown it, else the policy's figure."""
    learned = state.canonical.safe_point_latency
    if learned.samples >= p.estimate_samples_min:
        return int(learned.mean_ms)
    return p.safe_point_ms


def natural_wait_ms(state: State, job: Job, nodes, curve: "ReleaseCurve | None" = None) -> int:
    """When would the job fit without preempting, as running jobs finish as estimated: on
    its own (the earliest gang fit), and after the GPUs that jobs served before it ask for
    (queued at more urgent levels, or earlier at its own) have been taken from the pool of
    its models. Below the urgent levels only jobs ahead no larger than it count: a larger
    gang ahead cannot start on the releases that would start this job before it has
    gathered more, and the placement pass starts this job on them meanwhile (backfill).
    (Counting them forecast less urgent jobs behind queued gangs to wait weeks, and such
    forecasts priced preemptions of never-checkpointing jobs days into their runs.) At the
    urgent levels every job ahead counts: the urgent head gang gets its nodes
    drained for it (a drain hold, core/passes/placement.py), so a larger urgent gang ahead
    does take the releases; and an urgent job's wait past its target is priced explicitly
    (core/rules/pricing.py `overdue_premium`). Below the urgent levels the releases are uncertain:
    the job's own fit is the expected first of them (`expected_first_fit_ms`), and the
    GPUs ahead drain at the pool's turnover (`ReleaseCurve`); at the urgent levels the
    soonest point estimate and the median pace stand (the urgent jobs ahead take the
    releases first; forecast sooner, urgent jobs declined and waited past their target)."""
    fit = earliest_fit(state, job, nodes)
    if fit is None:
        return 10 * expected_runtime_ms(state, job)
    urgent = job.level < state.canonical.policy.urgent_levels
    if urgent:
        first = fit[0]
        ahead = sum(state.index.queued_gpus[: job.eff_level]) + _same_level_ahead(state, job, LARGEST)
    else:
        first = expected_first_fit_ms(state, job.gpus, nodes, fit[0])
        ahead = _more_urgent_ahead(state, job) + _same_level_ahead(state, job, job.gpus)
    if ahead == 0:
        return first
    curve = curve or ReleaseCurve(state, nodes, expected_runtime_ms(state, job))
    return max(first, curve.wait_for(ahead + job.gpus, turnover=not urgent))


def expected_first_fit_ms(state: State, gpus: int, nodes, soonest_ms: int) -> int:
    """When a job of `gpus` GPUs that fits one node can expect its first fit: the expected
    FIRST of many uncertain releases, not the soonest of their point estimates
    (`soonest_ms`, the earliest fit). A running job's remaining time is known only by its
    expectation `m` (`remaining_ms`); the law of a positive time with only its mean known
    (the one that assumes nothing more, of greatest entropy) is the exponential, so the job
    releases at rate 1/m, and the first of independent releases comes after 1 / (the sum of
    their rates): always sooner than the soonest expectation, and much sooner among
    hundreds of running jobs. (The soonest expectation among many running jobs is far
    later than the first release, and urgent jobs would preempt instead of waiting.) A node
    fits the job when one of its holders that frees enough on
    its own releases (rate 1/m each) or, if sooner, at its own point fit T (rate 1/T): so
    never later than `soonest_ms`. A gang larger than a node needs several releases at
    once: its point fit stands. Memoised (see `fits_memo`)."""
    if soonest_ms <= 0 or gpus > size_max(nodes):
        return soonest_ms
    memo = fits_memo(state)
    key = ("first", gpus, nodes_key(nodes))
    first = memo.get(key)
    if first is None:
        rate = 0.0
        kept = state.scratch.node_releases
        for node in nodes:
            if node.gpus < gpus:
                continue
            free = node.holder.count("")  # node_free_count
            releases = kept.get(node.name)
            if releases is None:
                releases = node_releases(state, node)
            alone = 0.0
            for at_ms, freed in releases:
                if free + freed >= gpus:
                    alone += 1.0 / max(at_ms, 1)
            at = _first_fit_time(free, releases, gpus)
            if at is not None:
                rate += max(alone, 1.0 / max(at, 1))
        first = memo[key] = soonest_ms if rate <= 0.0 else min(soonest_ms, int(1.0 / rate))
    return first


LARGEST = 1 << 30  # no gang is larger: every job ahead counts


def _more_urgent_ahead(state: State, job: Job) -> int:
    """GPUs asked for by the jobs queued at more urgent levels, no larger than the job."""
    size = job.gpus
    total = 0
    for by_size in state.index.queued_gpus_by_level_size[: job.eff_level]:
        for gpus, asked in by_size.items():
            if gpus <= size:
                total += asked
    return total


def _same_level_ahead(state: State, job: Job, size: int) -> int:
    """GPUs asked for by the jobs of `size` GPUs or fewer queued at the job's level before
    it in queue order (their own level, then submit time), whatever their team: in a burst
    of urgent jobs, the last one waits for the releases the first ones take. Counted up to
    the pool's size, beyond which no running job's end tells the wait anyway."""
    c = state.canonical
    key = queue_key(job)
    cap = state.index.total_gpus
    total = 0
    for team in sorted(state.index.queues[job.eff_level]):
        team_queue = state.index.queues[job.eff_level][team]
        for _, _, other in team_queue[: bisect.bisect_left(team_queue, key)]:
            gpus = c.jobs[other].gpus
            if gpus <= size:
                total += gpus
                if total >= cap:
                    return total
    return total


def queued_ahead(state: State, preemptor: Job, level: int) -> int:
    """GPUs asked for by jobs queued at `level` or more urgent, less the preemptor's own
    (it takes the victims' GPUs, not released ones)."""
    ahead = sum(state.index.queued_gpus[: level + 1])
    return ahead - (preemptor.gpus if preemptor.eff_level <= level else 0)


class ReleaseCurve:
    """GPUs of some nodes that become free over time as running jobs end as estimated:
    `wait_for(g)` is when `g` of them will have been free at once, pooled over the nodes
    (a queue's view: whoever is first in line takes the next GPU that frees).

    The tail of the curve is its least certain part (a few long overrunning jobs), and past
    it the queue drains at a pace no running job tells: so a wait is also bounded by a pace.
    At the urgent levels, the pool's typical pace: the GPUs freed by the median release over
    its time. Below them (`turnover`), the pace the pool can be expected to free GPUs at
    now: each running job releases its GPUs at rate 1/m, m its expected remaining time (the
    exponential law, as in `expected_first_fit_ms`), so the pace is the sum of GPUs / m.
    The median release counts each running job once; but the jobs running at any moment
    are the long ones (length-biased), and the GPUs the short ones free are freed again
    when the short jobs that take them end, so it understates how fast a full pool turns
    over for the jobs queued below the urgent levels: their natural waits would be forecast
    many times too long, and jobs forecast to wait hundreds of hours would throw away
    never-checkpointed work to save them. The urgent levels keep the median pace: the GPUs
    that free are taken first by the urgent jobs queued ahead, which the turnover of the
    whole pool does not tell (with the turnover their forecasts fall under the wait target
    and they wait longer: docs/EXPERIMENTS.md).

    With `Policy.release_curve_grid_ms` set, every release is read as at the start of the
    current grid step and the pool is kept across steps (core/forecast/release_pool.py): each
    release time off by less than one step, the curve costs the nodes events changed, not
    every running job of the pool."""

    def __init__(self, state: State, nodes, beyond_ms: int) -> None:
        grid_ms = state.canonical.policy.release_curve_grid_ms
        self._pool: ReleasePool | None = None
        self._median: tuple[float | None] | None = None
        if grid_ms <= 0:
            self.free, self.times, self.freed, self.pace, self.turnover = _pooled_releases(state, nodes)
            self.beyond_ms = (self.times[-1] if self.times else 0) + beyond_ms
            return
        if isinstance(nodes, UpNodes):
            pool = kept_pool(state, nodes.models, grid_ms)
            left_out = [pool.entry[name] for name in sorted(nodes.excluded) if name in pool.entry]
        else:
            pool = fresh_pool(state, nodes, grid_time(state.canonical.t, grid_ms))
            left_out = []
        self._pool = pool
        self._skipped = sorted(release for _, releases, _ in left_out for release in releases)
        self.free = pool.free - sum(free for free, _, _ in left_out)
        self._count = pool.count - len(self._skipped)
        turnover = pool.turnover - sum(part for _, _, part in left_out)
        self.turnover = turnover / (1 << TURNOVER_SCALE_BITS) if self._count else None
        last = pool.last(self._skipped)
        self.beyond_ms = (last[0] if last is not None else 0) + beyond_ms

    def wait_for(self, gpus: int, turnover: bool = False) -> int:
        """When `gpus` GPUs of these nodes will have been free at once (0 if they are now),
        bounded by the median pace, or with `turnover` by the pool's turnover now."""
        need = gpus - self.free
        if need <= 0:
            return 0
        if self._pool is None:
            i = bisect.bisect_left(self.freed, need)
            on_curve = self.times[i] if i < len(self.times) else self.beyond_ms
            pace = self.turnover if turnover else self.pace
        else:
            found = self._pool.walk(self._skipped, gpus=need)
            on_curve = found[0][0] if found is not None else self.beyond_ms
            pace = self.turnover if turnover else self._median_pace()
        return on_curve if pace is None else min(on_curve, int(need / pace))

    def _median_pace(self) -> float | None:
        # The GPUs freed by the median release over its time, as `_pooled_releases` has it.
        if self._median is None:
            pool = self._pool
            found = (
                pool.walk(self._skipped, rank=self._count // 2) if pool is not None and self._count else None
            )
            self._median = (None if found is None else found[1] / max(found[0][0], 1),)
        return self._median[0]


def _pooled_releases(state: State, nodes) -> tuple[int, list[int], list[int], float | None, float | None]:
    """The free GPUs of these nodes, their release times pooled, soonest first, the GPUs
    freed by each, the pace at the median release and the turnover (GPUs per ms expected to
    free now: the sum of GPUs / time to release; see `ReleaseCurve`; both None when nothing
    runs). Memoised (see `fits_memo`)."""
    memo = fits_memo(state)
    key = ("pooled", nodes_key(nodes))
    pooled = memo.get(key)
    if pooled is None:
        releases: list[tuple[int, int]] = []
        free = 0
        # node_releases(state, node), its memo read inline (`fits_memo` moved it to now).
        kept = state.scratch.node_releases
        for node in nodes:
            node_list = kept.get(node.name)
            releases += node_list if node_list is not None else node_releases(state, node)
            free += node.holder.count("")  # node_free_count
        releases.sort()
        times = [at for at, _ in releases]
        freed = list(itertools.accumulate([g for _, g in releases]))
        median = len(times) // 2
        pace = (freed[median] / max(times[median], 1)) if times else None
        turnover = sum(g / max(at, 1) for at, g in releases) if releases else None
        pooled = memo[key] = (free, times, freed, pace, turnover)
    return pooled


def fits_memo(state: State) -> dict:
    """Forecasts over nodes, kept while no node's releases or free GPUs change (the index's
    `releases_gen`) and the time stays the same."""
    sx = state.scratch
    node_releases_at(state)
    if sx.fits_memo_gen != sx.releases_gen:
        sx.fits_memo.clear()
        sx.fits_memo_gen = sx.releases_gen
    return sx.fits_memo


def node_releases_at(state: State) -> None:
    """Move the memoised release lists to the current time (they are dropped when it moved)."""
    sx = state.scratch
    if sx.node_releases_t != state.canonical.t:
        sx.node_releases.clear()
        sx.node_releases_t = state.canonical.t
        sx.releases_gen += 1


def remaining_or_runtime(state: State, job_id: str) -> int:
    """Until a holding job releases its GPUs: its remaining time when running, else its
    whole expected runtime. Its `release_spec` is memoised in the scratch until an event
    touches the job, its team and kind's learned runtime changes, or the policy changes."""
    spec = state.scratch.remaining_memo.get(job_id)
    if spec is None or state.canonical.estimates.get(spec[4]) is not spec[5]:
        spec = state.scratch.remaining_memo[job_id] = release_spec(state, state.canonical.jobs[job_id])
    return remaining_at(spec, state.canonical.t)


def node_releases(state: State, node) -> list[tuple[int, int]]:
    """(ms until release, GPUs) of the jobs holding GPUs on the node, soonest first.
    Memoised for the current time until an event changes the node's jobs (see Index): a
    scheduling pass asks for the same nodes' releases for every job it weighs (natural
    waits, release curves, reservations)."""
    sx = state.scratch
    t = state.canonical.t
    if sx.node_releases_t != t:
        node_releases_at(state)
    releases = sx.node_releases.get(node.name)
    if releases is None:
        fit = sx.node_fits.get(node.name)  # a kept forecast reads them off its lines
        releases = None if fit is None else fit.releases_at(state, t)
        if releases is not None:
            sx.node_releases[node.name] = releases
            return releases
        releases = []
        for spec, gpus in holder_specs(state, node):
            fixed, total, done, since = spec[:4]
            if fixed < 0:  # as remaining_at
                done += max(0, t - since)
                fixed = max(total - done, done - total, total // LINDY_FLOOR_FRACTION, 1)
            releases.append((fixed, gpus))
        releases.sort()
        sx.node_releases[node.name] = releases
    return releases


def earliest_fit(state: State, job: Job, nodes) -> tuple[int, list[str]] | None:
    """The earliest time the job's gang would fit without preempting, and on which nodes,
    as running jobs finish as estimated; None if it never would on these nodes. Memoised
    (see `fits_memo`): it depends on the nodes and the job's size only."""
    memo = fits_memo(state)
    key = ("earliest", job.gpus, nodes_key(nodes))
    if key not in memo:
        memo[key] = _earliest_fit(state, job, nodes)
    fit = memo[key]
    return None if fit is None else (fit[0], list(fit[1]))


def _earliest_fit(state: State, job: Job, nodes) -> tuple[int, list[str]] | None:
    need = job.gpus
    if need <= size_max(nodes):
        if isinstance(nodes, UpNodes):
            answered, fit = ordered_single_fit(state, nodes, need)
            if answered:
                return fit
        return earliest_single_fit(state, nodes, need)
    best: tuple[int, list[str]] | None = None
    by_model: dict[str, list[tuple[str, int, list[tuple[int, int]]]]] = {}
    for node in nodes:
        by_model.setdefault(node.gpu_model, []).append(
            (node.name, node_free_count(node), node_releases(state, node))
        )
    for model in sorted(by_model):  # a gang spanning nodes stays on one GPU model
        fit = _earliest_fit_across(by_model[model], job.gpus)
        if fit is not None and (best is None or fit[0] < best[0]):
            best = fit
    return best


def _earliest_fit_across(
    nodes: list[tuple[str, int, list[tuple[int, int]]]], need: int
) -> tuple[int, list[str]] | None:
    pooled = sorted(release for _, _, releases in nodes for release in releases)
    wait = _first_fit_time(sum(free for _, free, _ in nodes), pooled, need)
    if wait is None:
        return None
    # The fewest nodes that hold enough GPUs by then, the fullest first.
    ready = sorted(
        (-(free + sum(g for at, g in releases if at <= wait)), name) for name, free, releases in nodes
    )
    chosen: list[str] = []
    total = 0
    for neg_available, name in ready:
        if total >= need:
            break
        chosen.append(name)
        total -= neg_available
    return wait, sorted(chosen)


def _first_fit_time(free: int, releases: Iterable[tuple[int, int]], need: int) -> int | None:
    if free >= need:
        return 0
    for at_ms, gpus in releases:
        free += gpus
        if free >= need:
            return at_ms
    return None
