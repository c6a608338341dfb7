"""What a victim costs: its displacement (its expected requeue wait in GPU-seconds weighted
by its level; on the GPUs the preemptor takes, no more than the wait the preemptor saves)
and the work the preemption wastes (lost progress, checkpoint save, restore) weighted by
its level, but never below `wasted_work_weight_min` nor below the queue's pressure (the
other queued GPUs' summed level weights per GPU of the pool: wasted capacity delays them
all). Each victim lets go the cheaper way, the preemptor's weighted wait included: from
its last checkpoint at its next safe point, or after a save. An urgent preemptor's wait
past its target is priced explicitly (`wait_priced_s`, `overdue_premium`).
"""

from __future__ import annotations

import msgspec

from ..forecast.requeue_fit import RequeueFit
from ..forecast.waits import ReleaseCurve, queued_ahead, safe_point_ms
from ..model.policy import Policy
from ..model.state import State
from ..model.state import recovery_boost as recovery_boost  # re-exported (X as X)
from ..model.state import requeue_level_under
from ..model.entities import QUEUED, Job, job_progress_ms, last_checkpoint
from .copies import checkpoint_save_ms
from .notices import save_left_ms


class VictimCost(msgspec.Struct, kw_only=True):
    """What preempting one victim costs and how it lets go (lost progress, save, restore, its
    requeue wait, notice to release)."""

    job: str
    gpus: int
    lost_ms: int
    save_ms: int
    restore_ms: int
    requeue_wait_ms: int
    ready_ms: int  # notice -> released
    checkpoint_needed: bool
    cost: float
    lost_cost: float = 0.0  # the part of `cost` that is progress thrown away


def can_checkpoint(job: Job) -> bool:
    """Whether the job checkpoints at all (a periodic interval is set)."""
    return job.ckpt_interval_ms > 0


class Pricing(msgspec.Struct, frozen=True):
    """What one plan's victims are priced against."""

    wasted_weight_min: float  # the queue's pressure: weight of a wasted GPU-second
    waiting_weight: float  # the preemptor's weighted GPUs, per ms of its wait
    preemptor_gpus: int
    safe_point_ms: int  # notice -> safe point (see `safe_point_ms`)
    # A victim's extra wait, on the GPUs the preemptor takes from it, is at most what the
    # preemptor saves: its GPU-time moves earlier, it does not grow, so whatever a requeued
    # victim waits beyond that, the jobs it lets ahead (as urgent as it or more) gain.
    displaced_max_ms: int
    release_wait_max_ms: int = 0  # the preemptor's level's bound on a victim's release; 0: none
    preemptor_level: int = 0  # a victim is never weighed at or above it (see `priced_level`)
    # Per gang size, the GPUs queued jobs other than the preemptor ask for: a victim's GPUs
    # the preemptor does not take go at once to those that fit in them (see `victim_cost`).
    queued_by_size: dict[int, int] = {}


def victim_cost(state: State, victim: Job, requeue_wait_ms: int, p: Policy, pricing: Pricing) -> VictimCost:
    """What preempting `victim` costs: its displacement (its weighted requeue wait, bounded
    by the preemptor's saved wait on the GPUs the preemptor takes) and the work wasted,
    releasing it the cheaper way: at its next safe point from its last checkpoint (losing
    the progress since), or after saving a fresh one (the preemptor waits for the save).
    An urgent preemptor makes a victim with little unsaved work release without saving."""
    t = state.canonical.t
    last = last_checkpoint(victim)
    weight = p.level_weight[priced_level(victim, t, pricing.preemptor_level)]
    wasted_weight = victim.gpus * max(weight, p.wasted_work_weight_min, pricing.wasted_weight_min)
    options = release_options(victim, t, p, pricing)
    overhead = int(p.preemption_overhead_s * 1000)  # teardown, relaunch, warm-up
    to_safe_point = victim_safe_point_ms(victim, pricing.safe_point_ms)
    best = None
    for lost, save, checkpoint_needed in options:
        has_checkpoint = last is not None or checkpoint_needed or save > 0
        restore = victim.restore_cost_ms if has_checkpoint else 0
        ready = to_safe_point + save
        wasted = wasted_weight * (lost + save + restore + overhead) / 1000.0
        key = wasted + pricing.waiting_weight * ready
        if best is None or key < best[0]:
            best = (key, wasted, lost, save, restore, ready, checkpoint_needed)
    assert best is not None  # options always has the let-go-now option
    _, wasted, lost, save, restore, ready, checkpoint_needed = best
    lost_cost = wasted_weight * lost / 1000.0
    cost = wasted + weight * displaced_gpu_ms(victim, requeue_wait_ms, pricing) / 1000.0
    return VictimCost(
        job=victim.id,
        gpus=victim.gpus,
        lost_ms=lost,
        save_ms=save,
        restore_ms=restore,
        requeue_wait_ms=requeue_wait_ms,
        ready_ms=ready,
        checkpoint_needed=checkpoint_needed,
        cost=cost,
        lost_cost=lost_cost,
    )


def release_options(victim: Job, t: int, p: Policy, pricing: Pricing) -> list[tuple[int, int, bool]]:
    """The ways a victim may let go, as (progress lost, save wait, checkpoint needed):
    releasing from the last checkpoint (or scratch) is always possible; saving first, or
    finishing the save under way, only if the preemptor's level waits long enough for it."""
    last = last_checkpoint(victim)
    since_ckpt = job_progress_ms(victim, t) - (last.progress_ms if last else 0)
    options = [(since_ckpt, 0, False)]
    if victim.ckpt_started_t:
        # A checkpoint is being written: waiting for it loses nothing.
        options.append((0, save_left_ms(victim, t, p), False))
    elif can_checkpoint(victim):
        options.append((0, checkpoint_save_ms(victim, p), True))
    bound = pricing.release_wait_max_ms
    if (
        bound
        and len(options) > 1
        and victim_safe_point_ms(victim, pricing.safe_point_ms) + options[1][1] > bound
    ):
        options = options[:1]  # no time to save: it lets go from its last checkpoint
    return options


def displaced_gpu_ms(victim: Job, requeue_wait_ms: int, pricing: Pricing) -> int:
    """The GPU-time a victim's requeue wait displaces. The GPUs the preemptor does not take
    (a gang victim's rest) go at once to the queued jobs small enough for them, as far as
    those ask: the victim's wait there is their gain, GPU-time moved, not lost. Only those
    the queue leaves idle until the victim returns are charged its whole requeue wait. So a
    gang's displacement does not grow with the backlog while the urgent wait it blocks
    does."""
    shared = min(victim.gpus, pricing.preemptor_gpus)
    rest = victim.gpus - shared
    idle = max(0, rest - queued_fitting(pricing.queued_by_size, rest))
    return shared * min(requeue_wait_ms, pricing.displaced_max_ms) + idle * requeue_wait_ms


def victim_cost_floor(state: State, victim: Job, requeue_wait_ms: int, p: Policy, pricing: Pricing) -> float:
    """A price no victim of `victim`'s class (core.model.state.victim_class) that has as much
    unsaved work or more is priced below by `victim_cost` at a requeue wait of
    `requeue_wait_ms` or more: each way of letting go priced at the lighter of the weights its level
    may be priced at (restart protection comes and goes), the cheapest way taken (which way
    a victim takes depends on its preemptor's wait too, so its cost is no less than the
    cheapest way's). Each term only grows with the lost progress and the requeue wait."""
    t = state.canonical.t
    weight = p.level_weight[victim.level]
    if victim.boost:
        weight = min(weight, p.level_weight[priced_level(victim, t + 1, pricing.preemptor_level, True)])
    wasted_weight = victim.gpus * max(weight, p.wasted_work_weight_min, pricing.wasted_weight_min)
    overhead = int(p.preemption_overhead_s * 1000)
    last = last_checkpoint(victim)
    wasted = None
    for lost, save, checkpoint_needed in release_options(victim, t, p, pricing):
        has_checkpoint = last is not None or checkpoint_needed or save > 0
        restore = victim.restore_cost_ms if has_checkpoint else 0
        option = wasted_weight * (lost + save + restore + overhead) / 1000.0
        if wasted is None or option < wasted:
            wasted = option
    assert wasted is not None
    return wasted + weight * displaced_gpu_ms(victim, requeue_wait_ms, pricing) / 1000.0


def queue_pressure(state: State, p: Policy, preemptor: Job | None = None) -> float:
    """What one GPU-second of wasted work costs the queue: redoing it delays every queued
    job by its share of the pool, so it weighs the queued GPUs' level weights summed, per
    GPU of the pool (0 when nothing waits). The preemptor is not delayed by it: it starts
    on the victims' GPUs, and its own wait is the benefit side."""
    ix = state.index
    # Queued jobs weigh at their own level: aging orders the queue, it is no claim on GPUs.
    weighted = sum(gpus * p.level_weight[level] for level, gpus in enumerate(ix.queued_gpus_base))
    if preemptor is not None and preemptor.state == QUEUED:
        weighted -= preemptor.gpus * p.level_weight[preemptor.level]
    pressure = max(0.0, weighted) / max(ix.total_gpus, 1)
    if preemptor is not None and preemptor.level < p.urgent_levels:
        # For the urgent levels, the same footing at any load: a wasted GPU-second delays
        # the queue by one GPU-second, which is worth no more than a GPU-second of the
        # preemptor's own wait (the jobs it delays are served after the preemptor, or they
        # would have been placed first). Without the cap the backlog, not the trade, decides.
        # A less urgent preemptor's wait is itself a product of the backlog: under overload
        # its natural wait grows without bound, so its throwing work away must pay the
        # queue's whole pressure (capped, it would throw away most of the work lost on an
        # overloaded pool).
        pressure = min(pressure, p.level_weight[preemptor.level])
    return pressure


def queued_by_size(state: State, preemptor: Job) -> dict[int, int]:
    """Per gang size, GPUs asked for by the queued jobs other than the preemptor."""
    sizes = state.index.queued_gpus_by_size
    if preemptor.state != QUEUED or preemptor.gpus not in sizes:
        return sizes
    sizes = dict(sizes)
    sizes[preemptor.gpus] -= preemptor.gpus
    return sizes


def queued_fitting(sizes: dict[int, int], gpus: int) -> int:
    """GPUs asked for by queued jobs whose gangs fit in `gpus`."""
    return sum(asked for size, asked in sizes.items() if size <= gpus)


def victim_safe_point_ms(victim: Job, learned_ms: int) -> int:
    """Notice to safe point for this victim: half its safe-point interval when known (it is
    somewhere inside an iteration), else what victims have been seen to take."""
    if victim.safe_point_interval_ms:
        return victim.safe_point_interval_ms // 2
    return learned_ms


def priced_level(victim: Job, t: int, preemptor_level: int = 0, protected: bool = False) -> int:
    """The level a victim's losses are weighed at: its own, raised by its recovery boost
    while its restart protection lasts (a job preempted lately is dearer to preempt again,
    even by the urgent levels its protection does not cover), but never to the
    preemptor's level or above: the preemptor's level has the right to preempt it, and a
    victim weighed as urgent as the preemptor could never be worth displacing (its
    displacement would outweigh the very wait it saves), which would turn "dearer" into
    "protected" against the levels the protection does not cover."""
    if (protected or victim.protected_until_t > t) and victim.boost:
        return min(victim.level, max(preemptor_level + 1, victim.level - victim.boost))
    return victim.level


def requeue_level(state: State, victim: Job) -> int:
    """The queue level a victim returns to: its base level raised by the recovery boost."""
    return requeue_level_under(state.canonical.policy, victim)


def wait_priced_s(p: Policy, level: int, wait_ms: int) -> float:
    """A job's wait since it queued, in seconds weighted against its level's weight: at
    the urgent levels (below `urgent_levels`) each second past `urgent_wait_target_s`
    counts `urgent_overdue_factor` times (an urgent job's wait is judged by its tail, the
    target is its SLO); at the other levels every second counts once."""
    wait_s = max(0, wait_ms) / 1000.0
    if level >= p.urgent_levels:
        return wait_s
    return wait_s + (p.urgent_overdue_factor - 1.0) * max(0.0, wait_s - p.urgent_wait_target_s)


def wait_saved_s(p: Policy, job: Job, t: int, natural_wait_ms: int, ready_ms: int) -> float:
    """What a preemption that starts `job` in `ready_ms` instead of its natural wait saves,
    in priced seconds (see `wait_priced_s`): its wait so far plus either. A job that has
    waited past its level's target saves the dearer seconds; so does one whose forecast
    carries it past the target."""
    if natural_wait_ms <= ready_ms:
        return 0.0
    waited = max(0, t - job.queued_since_t)
    return wait_priced_s(p, job.level, waited + natural_wait_ms) - wait_priced_s(
        p, job.level, waited + ready_ms
    )


def overdue_premium(
    p: Policy, job: Job, t: int, natural_wait_ms: int, ready_ms: int, costs: list[VictimCost]
) -> float:
    """What an urgent job's wait past its target adds to a preemption's benefit, in weighted
    GPU-seconds: the priced seconds saved (`wait_saved_s`) beyond the plain ones, at its
    level's weight and GPUs; but never more than the victims' disruption, their cost less
    the progress they throw away. The premium buys a victim's requeue wait, save, restore
    and overhead, not destroyed work: the pool must redo that whatever the urgency, so
    unsaved work is weighed against the plain wait saved, as at every level."""
    if job.level >= p.urgent_levels or natural_wait_ms <= ready_ms:
        return 0.0
    plain_s = (natural_wait_ms - ready_ms) / 1000.0
    extra_s = wait_saved_s(p, job, t, natural_wait_ms, ready_ms) - plain_s
    disruption = sum(c.cost - c.lost_cost for c in costs)
    return min(p.level_weight[job.level] * job.gpus * extra_s, max(0.0, disruption))


def pricing_for(state: State, job: Job, p: Policy, runtime_ms: int, natural_wait: int) -> Pricing:
    """What the victims of a preemption for `job` are priced against."""
    safe_point = safe_point_ms(state, p)
    return Pricing(
        wasted_weight_min=queue_pressure(state, p, job),
        waiting_weight=p.level_weight[job.level] * job.gpus / 1000.0,
        preemptor_gpus=job.gpus,
        safe_point_ms=safe_point,
        displaced_max_ms=min(runtime_ms, max(0, natural_wait - safe_point)),
        release_wait_max_ms=p.release_wait_max_ms[job.level],
        preemptor_level=job.level,
        queued_by_size=queued_by_size(state, job),
    )


def price_victims(
    state: State,
    job: Job,
    eligible: list[Job],
    p: Policy,
    pricing: Pricing,
    curve: ReleaseCurve,
    fit: RequeueFit | None,
) -> dict[str, VictimCost]:
    """Each eligible victim's cost. Its requeue wait is the later of two: the queue's view
    (the release curve of the preemptor's nodes, after the GPUs queued at its requeue level
    or more urgent and the GPUs the preemptor takes: its own GPUs come back to the pool
    with the preemption, so it needs no release for them; none when no job is queued ahead
    of it) and where it can really run again
    (`fit`: per node, or per gang). A reclaim (`fit` None) charges no displacement."""
    if fit is None:
        return {victim.id: victim_cost(state, victim, 0, p, pricing) for victim in eligible}
    prices = LazyPrices(state, job, eligible, p, pricing, curve, fit)
    return {victim.id: prices.exact(victim.id) for victim in eligible}


class LazyPrices:
    """The victims' costs of one plan (`price_victims`), each worked out only when asked
    for, and a cheap bound below each first: a victim's requeue wait is never less than the
    queue's view of it (`queue_wait`), the part that needs no search over the nodes, and
    its cost grows with its requeue wait, all else the same (`lower`: its cost at that wait,
    with the exact release time). So a victim set whose bound already loses to a set priced
    exactly needs no exact prices (core/passes/victims.py)."""

    def __init__(
        self,
        state: State,
        job: Job,
        eligible: list[Job],
        p: Policy,
        pricing: Pricing,
        curve: ReleaseCurve,
        fit: RequeueFit,
    ) -> None:
        self.state = state
        self.job = job
        self.p = p
        self.pricing = pricing
        self.curve = curve
        self.fit = fit
        self.victims = {victim.id: victim for victim in eligible}
        self._queue_waits: dict[int, int] = {}  # per requeue level
        self._levels: dict[str, int] = {}
        self._lower: dict[str, VictimCost] = {}
        self._exact: dict[str, VictimCost] = {}

    def queue_wait(self, victim_id: str) -> int:
        """The queue's view of the victim's requeue wait: the release curve of the
        preemptor's nodes, after the GPUs queued at its requeue level or more urgent and
        the GPUs the preemptor takes."""
        level = self._levels.get(victim_id)
        if level is None:
            level = self._levels[victim_id] = requeue_level(self.state, self.victims[victim_id])
        return self.queue_wait_at(level)

    def admit(self, victim: Job) -> None:
        """Count `victim` among the eligible (a search that finds them as it goes)."""
        self.victims[victim.id] = victim

    def queue_wait_at(self, level: int) -> int:
        """The queue's view of the requeue wait of a victim that returns at `level`."""
        waits = self._queue_waits
        if level not in waits:
            # The preemption frees the victim's own GPUs: what it asks for itself is back
            # in the pool at once, so the releases must cover only the jobs queued ahead of
            # it and the GPUs the preemptor takes. With no job ahead, where it fits again
            # after the preemptor's take is `fit`'s to say.
            # Below the urgent levels a queued job's wait is bounded by the pool's
            # turnover, as the preemptor's natural wait is (`ReleaseCurve`).
            ahead = queued_ahead(self.state, self.job, level)
            turnover = level >= self.state.canonical.policy.urgent_levels
            waits[level] = self.curve.wait_for(ahead + self.job.gpus, turnover) if ahead else 0
        return waits[level]

    def lower(self, victim_id: str) -> VictimCost:
        """The victim priced at its queue wait: its cost no more than the exact one, its
        release time (`ready_ms`) the exact one."""
        cost = self._lower.get(victim_id)
        if cost is None:
            cost = self._exact.get(victim_id)
            if cost is None:
                victim = self.victims[victim_id]
                cost = victim_cost(self.state, victim, self.queue_wait(victim_id), self.p, self.pricing)
            self._lower[victim_id] = cost
        return cost

    def exact(self, victim_id: str) -> VictimCost:
        """The victim's cost, its requeue wait the later of the queue's view and where it
        can really run again (`RequeueFit`)."""
        cost = self._exact.get(victim_id)
        if cost is None:
            victim = self.victims[victim_id]
            queue_wait = self.queue_wait(victim_id)
            fits_at = self.fit.wait_ms(victim, at_least_ms=queue_wait)
            wait = queue_wait if fits_at is None else fits_at
            lower = self._lower.get(victim_id)
            if lower is not None and wait == queue_wait:
                cost = lower  # (the same inputs)
            else:
                cost = victim_cost(self.state, victim, wait, self.p, self.pricing)
            self._exact[victim_id] = cost
        return cost

    def exact_costs(self) -> dict[str, VictimCost]:
        """The victims priced exactly so far."""
        return self._exact
