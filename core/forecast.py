"""Forecasts from the running jobs: a job's expected runtime and remaining time (learned
per team and kind, Lindy beyond the estimate), when each node's GPUs will be released,
the earliest time a gang would fit without preempting, a queued job's natural wait (its
fit, after the GPUs that jobs served before it take), and how long a victim takes to
reach a safe point. Memoised in the index for the current time (see `Index`).
"""

from __future__ import annotations

import bisect
import itertools

from .placement import gpus_on
from .policy import Policy
from .state import RUNNING, Job, State, job_progress_ms, node_free_count, queue_key

LINDY_FLOOR_FRACTION = 10  # a job just past its estimate is expected to run 1/10 of it more


def expected_runtime_ms(state: State, job: Job) -> int:
    """History of the same team and kind once it has enough samples, else the submitter's."""
    est = state.canonical.estimates.get(f"{job.team}/{job.kind}")
    if est is not None and est.samples >= state.canonical.policy.estimate_samples_min:
        return int(est.mean_ms)
    return job.est_runtime_ms


def remaining_ms(state: State, job: Job) -> int:
    """Expected runtime minus progress. A job already past its estimate has shown it runs
    long: runtimes are heavy-tailed, so it is expected to run about as long again as it has
    overrun (the Lindy effect), and at least a tenth of the estimate, never zero."""
    total = expected_runtime_ms(state, job)
    done = job_progress_ms(job, state.canonical.t)
    if done < total:
        return total - done
    return max(done - total, total // LINDY_FLOOR_FRACTION, 1)


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
    its models."""
    fit = earliest_fit(state, job, nodes)
    if fit is None:
        return 10 * expected_runtime_ms(state, job)
    ahead = sum(state.index.queued_gpus[:job.eff_level]) + _same_level_ahead(state, job)
    if ahead == 0:
        return fit[0]
    curve = curve or ReleaseCurve(state, nodes, expected_runtime_ms(state, job))
    return max(fit[0], curve.wait_for(ahead + job.gpus))


def _same_level_ahead(state: State, job: Job) -> int:
    """GPUs asked for by the jobs queued at the job's level before it in queue order (their
    own level, then submit time), whatever their team: in a burst of urgent jobs, the last
    one waits for the releases the first ones take. Counted up to the pool's size, beyond
    which no running job's end tells the wait anyway."""
    c = state.canonical
    key = queue_key(job)
    cap = state.index.total_gpus
    total = 0
    for team in sorted(state.index.queues[job.eff_level]):
        team_queue = state.index.queues[job.eff_level][team]
        for _, _, other in team_queue[:bisect.bisect_left(team_queue, key)]:
            total += c.jobs[other].gpus
            if total >= cap:
                return total
    return total


def queued_ahead(state: State, preemptor: Job, level: int) -> int:
    """GPUs asked for by jobs queued at `level` or more urgent, less the preemptor's own
    (it takes the victims' GPUs, not released ones)."""
    ahead = sum(state.index.queued_gpus[:level + 1])
    return ahead - (preemptor.gpus if preemptor.eff_level <= level else 0)


class ReleaseCurve:
    """GPUs of some nodes that become free over time as running jobs end as estimated:
    `wait_for(g)` is when `g` of them will have been free at once, pooled over the nodes
    (a queue's view: whoever is first in line takes the next GPU that frees).

    The tail of the curve is its least certain part (a few long overrunning jobs), and past
    it the queue drains at a pace no running job tells: so a wait is also bounded by the
    pool's typical pace, the GPUs freed by the median release over its time."""

    def __init__(self, state: State, nodes, beyond_ms: int) -> None:
        releases = sorted(release for node in nodes for release in node_releases(state, node))
        self.free = sum(node_free_count(node) for node in nodes)
        self.times = [at for at, _ in releases]
        self.freed: list[int] = list(itertools.accumulate(g for _, g in releases))
        self.beyond_ms = (self.times[-1] if self.times else 0) + beyond_ms
        median = len(self.times) // 2
        # GPUs per ms at the median release; None when nothing runs.
        self.pace = (self.freed[median] / max(self.times[median], 1)) if self.times else None

    def wait_for(self, gpus: int) -> int:
        """When `gpus` GPUs of these nodes will have been free at once (0 if they are now)."""
        need = gpus - self.free
        if need <= 0:
            return 0
        i = bisect.bisect_left(self.freed, need)
        on_curve = self.times[i] if i < len(self.times) else self.beyond_ms
        return on_curve if self.pace is None else min(on_curve, int(need / self.pace))


def remaining_or_runtime(state: State, job_id: str) -> int:
    """Until a holding job releases its GPUs: its remaining time when running, else its
    whole expected runtime. Memoised in the index for the current time (see Index)."""
    ix = state.index
    if ix.remaining_memo_t != state.canonical.t:
        ix.remaining_memo.clear()
        ix.remaining_memo_t = state.canonical.t
    value = ix.remaining_memo.get(job_id)
    if value is None:
        other = state.canonical.jobs[job_id]
        value = remaining_ms(state, other) if other.state == RUNNING else expected_runtime_ms(state, other)
        ix.remaining_memo[job_id] = value
    return value


def node_releases(state: State, node) -> list[tuple[int, int]]:
    """(ms until release, GPUs) of the jobs holding GPUs on the node, soonest first.
    Memoised for the current time until an event changes the node's jobs (see Index): a
    scheduling pass asks for the same nodes' releases for every job it weighs (natural
    waits, release curves, reservations)."""
    ix = state.index
    if ix.node_releases_t != state.canonical.t:
        ix.node_releases.clear()
        ix.node_releases_t = state.canonical.t
    releases = ix.node_releases.get(node.name)
    if releases is None:
        jobs = state.canonical.jobs
        releases = sorted((remaining_or_runtime(state, j), len(gpus_on(jobs[j], node.name)))
                          for j in ix.jobs_by_node.get(node.name, {}))
        ix.node_releases[node.name] = releases
    return releases


def earliest_fit(state: State, job: Job, nodes) -> tuple[int, list[str]] | None:
    """The earliest time the job's gang would fit without preempting, and on which nodes,
    as running jobs finish as estimated; None if it never would on these nodes."""
    single = job.gpus <= max((n.gpus for n in nodes), default=0)
    best: tuple[int, list[str]] | None = None
    by_model: dict[str, list[tuple[str, int, list[tuple[int, int]]]]] = {}
    for node in nodes:
        free = node_free_count(node)
        releases = node_releases(state, node)
        if single:
            if node.gpus < job.gpus:
                continue
            wait = _first_fit_time(free, releases, job.gpus)
            if wait is not None and (best is None or (wait, node.name) < (best[0], best[1][0])):
                best = (wait, [node.name])
        else:
            by_model.setdefault(node.gpu_model, []).append((node.name, free, releases))
    for model in sorted(by_model):  # a gang spanning nodes stays on one GPU model
        fit = _earliest_fit_across(by_model[model], job.gpus)
        if fit is not None and (best is None or fit[0] < best[0]):
            best = fit
    return best


def _earliest_fit_across(nodes: list[tuple[str, int, list[tuple[int, int]]]],
                         need: int) -> tuple[int, list[str]] | None:
    pooled = sorted(release for _, _, releases in nodes for release in releases)
    wait = _first_fit_time(sum(free for _, free, _ in nodes), pooled, need)
    if wait is None:
        return None
    # The fewest nodes that hold enough GPUs by then, the fullest first.
    ready = sorted((-(free + sum(g for at, g in releases if at <= wait)), name)
                   for name, free, releases in nodes)
    chosen: list[str] = []
    total = 0
    for neg_available, name in ready:
        if total >= need:
            break
        chosen.append(name)
        total -= neg_available
    return wait, sorted(chosen)


def _first_fit_time(free: int, releases: list[tuple[int, int]], need: int) -> int | None:
    if free >= need:
        return 0
    for at_ms, gpus in releases:
        free += gpus
        if free >= need:
            return at_ms
    return None


class RequeueFit:
    """When a victim, requeued, would fit again as running jobs end as estimated: where it
    can really run, on one node when it fits one (free GPUs on different nodes do not add
    up for it), else as a gang over the nodes of one GPU model; and without what the
    preemption hands to the preemptor: on the victim's own nodes, its GPUs and the free
    ones go to the preemptor and come back at the preemptor's expected end.

    A node's fit is worked out once per victim size and plan, and the search for a victim
    stops at the first node where it would fit by the wait already known."""

    def __init__(self, state: State, nodes, preemptor_gpus: int, preemptor_runtime_ms: int) -> None:
        self.state = state
        self.nodes = nodes
        self.preemptor_gpus = preemptor_gpus
        self.preemptor_runtime_ms = preemptor_runtime_ms
        self.node_size_max = max((node.gpus for node in nodes), default=0)
        self._fits: dict[tuple[str, int], int | None] = {}
        self._by_name = {node.name: node for node in nodes}
        # Per victim size: (earliest fit, node) over the nodes as they are, soonest first.
        self._ranked: dict[int, list[tuple[int, str]]] = {}

    def wait_ms(self, victim: Job, at_least_ms: int = 0) -> int | None:
        """The victim's earliest fit after the preemption, but no sooner than `at_least_ms`
        (what the caller already knows it waits: the search stops at the first node that
        fits by then); None if it never would here."""
        own = {slot.node: len(slot.gpus) for slot in victim.placement}
        if victim.gpus > self.node_size_max:
            wait = self._gang_wait(victim, own)
            return None if wait is None else max(wait, at_least_ms)
        # The soonest fit on a node the victim does not hold (ranked once per size and plan),
        # then its own nodes as the preemption leaves them: O(own nodes) per victim.
        best = self._soonest_elsewhere(victim.gpus, own)
        for name in sorted(own):
            node = self._by_name.get(name)
            if node is None or node.gpus < victim.gpus:
                continue
            free, releases = self._after_preemption(node, victim, own[name])
            wait = _first_fit_time(free, releases, victim.gpus)
            if wait is not None and (best is None or wait < best):
                best = wait
        return None if best is None else max(best, at_least_ms)

    def _soonest_elsewhere(self, gpus: int, own: dict[str, int]) -> int | None:
        ranked = self._ranked.get(gpus)
        if ranked is None:
            ranked = sorted((wait, node.name) for node in self.nodes
                            if node.gpus >= gpus and (wait := self._fit(node, gpus)) is not None)
            self._ranked[gpus] = ranked
        for wait, name in ranked:
            if name not in own:
                return wait
        return None

    def _fit(self, node, gpus: int) -> int | None:
        """The earliest fit of `gpus` on the node as it is (memoised for this plan)."""
        key = (node.name, gpus)
        if key not in self._fits:
            self._fits[key] = _first_fit_time(node_free_count(node), node_releases(self.state, node), gpus)
        return self._fits[key]

    def _after_preemption(self, node, victim: Job, own_gpus: int) -> tuple[int, list[tuple[int, int]]]:
        """The node's free GPUs and releases once the preemptor has taken the victim's GPUs
        and the free ones it needs there."""
        free = node_free_count(node)
        taken = min(self.preemptor_gpus, free + own_gpus)
        releases = list(node_releases(self.state, node))
        mine = (remaining_or_runtime(self.state, victim.id), own_gpus)
        if mine in releases:
            releases.remove(mine)
        bisect.insort(releases, (self.preemptor_runtime_ms, taken))
        return max(0, free + own_gpus - taken), releases

    def _gang_wait(self, victim: Job, own: dict[str, int]) -> int | None:
        best = None
        for model in sorted(dict.fromkeys(node.gpu_model for node in self.nodes)):
            free_total = 0
            pooled: list[tuple[int, int]] = []
            for node in self.nodes:
                if node.gpu_model != model:
                    continue
                if node.name in own:
                    free, releases = self._after_preemption(node, victim, own[node.name])
                else:
                    free, releases = node_free_count(node), node_releases(self.state, node)
                free_total += free
                pooled += releases
            wait = _first_fit_time(free_total, sorted(pooled), victim.gpus)
            if wait is not None and (best is None or wait < best):
                best = wait
        return best
