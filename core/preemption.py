"""The preemption decision model: which running jobs to preempt for a blocked job, and
whether it is worth it.

1. match: victims on nodes of a GPU model the job accepts, that together with free GPUs
   give it a gang placement; the cheapest minimal set (ties broken by job id, node name);
2. benefit: the preemptor's wait saved (its expected wait for a natural release, from
   remaining-time estimates and the jobs served before it, minus the time the preemption
   takes, with the time to a safe point learned from past victims), in GPU-seconds
   weighted by its level;
3. cost: per victim, its displacement (its expected requeue wait in GPU-seconds weighted
   by its level; on the GPUs the preemptor takes, no more than the wait the preemptor
   saves) and the work the preemption wastes (lost progress, checkpoint save, restore)
   weighted by its level, but never below `wasted_work_weight_min` nor below the queue's
   pressure (the other queued GPUs' summed level weights per GPU of the pool: wasted
   capacity delays them all). Each victim lets go the cheaper way, the preemptor's
   weighted wait included: from its last checkpoint at its next safe point, or after a save;
4. fairness: protected teams and users, a victim cap, the levels' guaranteed shares, the
   teams' fair shares (`Guard`), and the preemptor's user limit. The limits guard a team
   or user against others: a job displacing its own team's (user's) work is neither held
   back by them nor counted toward them, and a user past the allowance may still preempt
   their own jobs.

A reclaim (`plan_preemption(..., reclaim=True)`) is the same decision for a job whose team
is below its fair share, over other teams' jobs held above theirs (see core/shares.py).

Preempt only when benefit - cost > policy.net_benefit_min. Pure functions of the state.
"""

from __future__ import annotations

import bisect
import itertools

import msgspec

from .placement import acceptable_models, free_indices, node_size_max, place
from .policy import Policy, with_params
from .shares import above_share, fair_shares, holding, within_share
from .state import (QUEUED, RUNNING, Job, State, job_progress_ms, last_checkpoint, node_free_count,
                    queue_key, teams_with_demand, window_count)
from .types import LEVELS, Slot

LINDY_FLOOR_FRACTION = 10  # a job just past its estimate is expected to run 1/10 of it more


class VictimCost(msgspec.Struct, kw_only=True):
    job: str
    gpus: int
    lost_ms: int
    save_ms: int
    restore_ms: int
    requeue_wait_ms: int
    ready_ms: int  # notice -> released
    checkpoint_needed: bool
    cost: float


class Plan(msgspec.Struct, kw_only=True):
    victims: list[str]
    placement: list[Slot]
    benefit: float
    cost: float
    ready_ms: int
    natural_wait_ms: int
    checkpoint_needed: dict[str, bool]
    reason: str
    reclaim: bool = False


class Decline(msgspec.Struct, kw_only=True):
    reason: str
    benefit: float = 0.0
    cost: float = 0.0


# ---------------------------------------------------------------- estimates


def expected_runtime_ms(state: State, job: Job) -> int:
    """History of the same team and kind once it has enough samples, else the submitter's."""
    est = state.c.estimates.get(f"{job.team}/{job.kind}")
    if est is not None and est.samples >= state.c.policy.estimate_samples_min:
        return int(est.mean_ms)
    return job.est_runtime_ms


def remaining_ms(state: State, job: Job) -> int:
    """Expected runtime minus progress. A job already past its estimate has shown it runs
    long: runtimes are heavy-tailed, so it is expected to run about as long again as it has
    overrun (the Lindy effect), and at least a tenth of the estimate, never zero."""
    total = expected_runtime_ms(state, job)
    done = job_progress_ms(job, state.c.t)
    if done < total:
        return total - done
    return max(done - total, total // LINDY_FLOOR_FRACTION, 1)


def safe_point_ms(state: State, p: Policy) -> int:
    """How long a victim takes from the notice to its safe point: the victims' mean once
    enough have shown it, else the policy's figure."""
    learned = state.c.safe_point_latency
    if learned.samples >= p.estimate_samples_min:
        return int(learned.mean_ms)
    return p.safe_point_ms


def can_checkpoint(job: Job) -> bool:
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


def victim_cost(state: State, victim: Job, requeue_wait_ms: int, p: Policy,
                pricing: Pricing) -> VictimCost:
    """What preempting `victim` costs: its displacement (its weighted requeue wait, bounded
    by the preemptor's saved wait on the GPUs the preemptor takes) and the work wasted,
    releasing it the cheaper way: at its next safe point from its last checkpoint (losing
    the progress since), or after saving a fresh one (the preemptor waits for the save).
    An urgent preemptor makes a victim with little unsaved work release without saving."""
    t = state.c.t
    last = last_checkpoint(victim)
    since_ckpt = job_progress_ms(victim, t) - (last.progress_ms if last else 0)
    weight = p.level_weight[victim.level]
    wasted_weight = victim.gpus * max(weight, p.wasted_work_weight_min, pricing.wasted_weight_min)
    if victim.ckpt_started_t:
        # A checkpoint is being written: wait for it rather than lose it.
        save = max(0, victim.ckpt_started_t + victim.ckpt_cost_ms - t)
        options = [(0, save, False)]
    else:
        options = [(since_ckpt, 0, False)]  # release from the last checkpoint (or scratch)
        if can_checkpoint(victim):
            options.append((0, victim.ckpt_cost_ms, True))
    bound = pricing.release_wait_max_ms
    if bound and len(options) > 1 and pricing.safe_point_ms + options[1][1] > bound:
        options = options[:1]  # no time to save: it lets go from its last checkpoint
    best = None
    for lost, save, checkpoint_needed in options:
        has_checkpoint = last is not None or checkpoint_needed or save > 0
        restore = victim.restore_cost_ms if has_checkpoint else 0
        ready = pricing.safe_point_ms + save
        wasted = wasted_weight * (lost + save + restore) / 1000.0
        key = wasted + pricing.waiting_weight * ready
        if best is None or key < best[0]:
            best = (key, wasted, lost, save, restore, ready, checkpoint_needed)
    _, wasted, lost, save, restore, ready, checkpoint_needed = best
    shared = min(victim.gpus, pricing.preemptor_gpus)
    displaced_gpu_ms = (shared * min(requeue_wait_ms, pricing.displaced_max_ms)
                        + (victim.gpus - shared) * requeue_wait_ms)
    cost = wasted + weight * displaced_gpu_ms / 1000.0
    return VictimCost(
        job=victim.id, gpus=victim.gpus, lost_ms=lost, save_ms=save, restore_ms=restore,
        requeue_wait_ms=requeue_wait_ms, ready_ms=ready, checkpoint_needed=checkpoint_needed,
        cost=cost)


def _still_queued(c, job_id: str) -> bool:
    job = c.jobs.get(job_id)
    return job is not None and job.state == QUEUED


def queue_pressure(state: State, p: Policy, preemptor: Job | None = None) -> float:
    """What one GPU-second of wasted work costs the queue: redoing it delays every queued
    job by its share of the pool, so it weighs the queued GPUs' level weights summed, per
    GPU of the pool (0 when nothing waits). The preemptor is not delayed by it: it starts
    on the victims' GPUs, and its own wait is the benefit side."""
    ix = state.ix
    weighted = sum(gpus * p.level_weight[level] for level, gpus in enumerate(ix.queued_gpus))
    if preemptor is not None and preemptor.state == QUEUED:
        weighted -= preemptor.gpus * p.level_weight[preemptor.eff_level]
    return max(0.0, weighted) / max(ix.total_gpus, 1)


def requeue_level(state: State, victim: Job) -> int:
    """The queue level a victim returns to: its base level raised by the recovery boost."""
    p = state.c.policy
    boost = min(p.requeue_boost_max, p.requeue_boost_per_preemption * (victim.preempt_count + 1))
    return max(0, victim.level - boost)


# ---------------------------------------------------------------- eligibility


def variant_policy(state: State, job: Job) -> Policy:
    """The policy an A/B variant's jobs are decided by: the base policy with the variant's
    overrides. Cached per variant until the next PolicyChanged."""
    base = state.c.policy
    overrides = base.ab_variants.get(job.variant)
    if not overrides:
        return base
    cache = state.ix.variant_policies
    if job.variant not in cache:
        cache[job.variant] = with_params(base, overrides)
    return cache[job.variant]


def may_preempt(state: State, job: Job) -> bool:
    return state.c.policy.preempts_from_level[job.level] < 8


def victim_eligible(state: State, preemptor: Job, victim: Job) -> bool:
    """A victim by priority: of a level the preemptor's level may preempt."""
    p = state.c.policy
    if victim.level < p.preempts_from_level[preemptor.level] or victim.level <= preemptor.level:
        return False
    return victim_preemptible_now(state, victim, preemptor)


def reclaim_victim_eligible(state: State, preemptor: Job, victim: Job) -> bool:
    """A victim of a reclaim: another team's job of a level reclaim may take (never the
    urgent levels), whatever the preemptor's level."""
    if victim.level < state.c.policy.fair_share_from_level or victim.team == preemptor.team:
        return False
    return victim_preemptible_now(state, victim, preemptor)


def victim_preemptible_now(state: State, victim: Job, preemptor: Job) -> bool:
    """Running, preemptible, in no saga, past its restart protection, and, unless the
    preemptor is of its own team (user), its team (user) not protected: the fairness
    limits protect a team and a user from others, not from reordering their own work."""
    c = state.c
    p = c.policy
    t = c.t
    if victim.state != RUNNING or not victim.preemptible or victim.saga:
        return False
    if victim.protected_until_t > t:
        return False
    if victim.team != preemptor.team and c.team_protected_until.get(victim.team, 0) > t:
        return False
    if victim.user == preemptor.user:
        return True
    win = c.user_windows.get(victim.user)
    if win is not None and window_count(win.preempted, t, p.fairness_window_ms) >= scaled_limit(state, p.user_preempted_max):
        return False
    return True


def user_preempting_exhausted(state: State, job: Job) -> bool:
    c = state.c
    win = c.user_windows.get(job.user)
    if win is None:
        return False
    return window_count(win.preempting, c.t, c.policy.fairness_window_ms) >= scaled_limit(
        state, c.policy.user_preempting_max)


def team_limit(state: State, team: str, per_100_gpus: int) -> int:
    """A team's fairness count: the pool-scaled limit for a team with an even share of the
    demand, times its own share (GPUs it holds and asks for, against the mean per team
    with demand). A team bringing half the work may preempt, and be preempted, as often
    as its size warrants; a small team is held to the base limit."""
    ix = state.ix
    base = scaled_limit(state, per_100_gpus)
    total = sum(ix.team_gpus.values()) + sum(ix.team_queued_gpus.values())
    own = ix.team_gpus.get(team, 0) + ix.team_queued_gpus.get(team, 0)
    if not total or not own:
        return base
    return max(base, base * own * len(teams_with_demand(ix)) // total)


def scaled_limit(state: State, per_100_gpus: int) -> int:
    """A fairness count for a 100-GPU pool, scaled to this pool (never below the count)."""
    return max(per_100_gpus, per_100_gpus * state.ix.total_gpus // 100)


# ---------------------------------------------------------------- the plan


def plan_preemption(state: State, job: Job, reclaim: bool = False) -> Plan | Decline:
    """Victims for a blocked job by priority or, with `reclaim`, by its team's fair share:
    then the victims are other teams' jobs above their shares, of any level from
    `fair_share_from_level` on, and they are charged the work wasted but no displacement (the
    GPUs they give back were the reclaiming team's share, lent while it did not ask)."""
    # A user past the allowance may still displace their own jobs: the limit counts only
    # preemptions of others' work.
    own_only = user_preempting_exhausted(state, job)
    if own_only and reclaim:
        return Decline(reason="user_preempting_limit")
    c = state.c
    p = variant_policy(state, job)
    ix = state.ix
    guard = Guard(state, job, p)
    if reclaim and not guard.below_share_with(job):
        return Decline(reason="reclaim_beyond_share")
    models = acceptable_models(job.gpu_models, ix)
    nodes = [c.nodes[name] for name in sorted(c.nodes)
             if c.nodes[name].up and c.nodes[name].gpu_model in models]
    if not nodes:
        return Decline(reason="no_node_of_model")
    runtime = expected_runtime_ms(state, job)
    # Nodes held for other blocked jobs are promised: they neither end this job's wait nor
    # can be freed for it, unless it would be done before the holder is expected to start.
    # (The reservations are from the last placement pass: skip those whose job has left
    # the queue since.)
    held = {name: start_t for name, (start_t, holder) in ix.reserved_nodes.items()
            if holder != job.id and c.t + runtime > start_t and _still_queued(c, holder)}
    if place(job.gpus, models, c.nodes, ix, held, c.t + runtime) is not None:
        # Held back only by the scan budget: no one needs to go.
        return Decline(reason="fits_without_preemption")
    if held:
        nodes = [node for node in nodes if node.name not in held]
        if not nodes:
            return Decline(reason="held_back_by_reservation")
    model_ok = dict.fromkeys(models)
    if reclaim:
        first_level, eligible_now = p.fair_share_from_level, reclaim_victim_eligible
    else:
        first_level, eligible_now = max(p.preempts_from_level[job.level], job.level + 1), victim_eligible
    eligible = [c.jobs[victim_id]
                for level in range(first_level, LEVELS)
                for victim_id in sorted(ix.holding_by_level[level])
                if (not own_only or c.jobs[victim_id].user == job.user)
                and eligible_now(state, job, c.jobs[victim_id])
                and (not reclaim or guard.allows({}, c.jobs[victim_id]))
                and any(c.nodes[slot.node].gpu_model in model_ok and slot.node not in held
                        for slot in c.jobs[victim_id].placement)]
    if not eligible:
        return Decline(reason="user_preempting_limit" if own_only else "no_eligible_victims")
    curve = ReleaseCurve(state, nodes, runtime)
    natural_wait = natural_wait_ms(state, job, nodes, curve)
    safe_point = safe_point_ms(state, p)
    pricing = Pricing(
        wasted_weight_min=queue_pressure(state, p, job),
        waiting_weight=p.level_weight[job.level] * job.gpus / 1000.0, preemptor_gpus=job.gpus,
        safe_point_ms=safe_point, displaced_max_ms=min(runtime, max(0, natural_wait - safe_point)),
        release_wait_max_ms=p.release_wait_max_ms[job.level])
    requeue_waits: dict[tuple[int, int], int] = {}
    costs: dict[str, VictimCost] = {}
    for victim in eligible:
        key = (requeue_level(state, victim), victim.gpus)
        if reclaim:
            requeue_waits[key] = 0
        elif key not in requeue_waits:
            requeue_waits[key] = curve.wait_for(_queued_ahead(state, job, key[0]) + victim.gpus)
        costs[victim.id] = victim_cost(state, victim, requeue_waits[key], p, pricing)
    victim_nodes = dict.fromkeys(slot.node for v in costs for slot in c.jobs[v].placement)
    candidate_nodes = [node for node in nodes if node.name in victim_nodes]
    # Victims are chosen by their cost plus the preemptor's weighted wait while they reach a
    # safe point (and save): an urgent job prefers victims that can let go quickly.
    rank = {v: vc.cost + pricing.waiting_weight * vc.ready_ms for v, vc in costs.items()}
    if job.gpus <= node_size_max(models, ix):
        choice = _cheapest_single_node(state, job, candidate_nodes, rank, guard,
                                       p.victims_per_preemption_max)
    else:
        choice = _cheapest_across_nodes_of_one_model(state, job, nodes, rank, guard,
                                                     p.victims_per_preemption_max)
    if choice is None:
        return Decline(reason="no_victim_set_within_limits")
    victims, placement = choice
    if not victims:  # it fits on GPUs held for a starving job: it waits like everyone else
        return Decline(reason="held_back_by_reservation")
    cost = sum(costs[v].cost for v in victims)
    ready = max(costs[v].ready_ms for v in victims)
    level_weight = p.level_weight[job.level]
    benefit = level_weight * job.gpus * max(0, natural_wait - ready) / 1000.0
    if benefit - cost <= p.net_benefit_min:
        return Decline(reason="benefit_below_cost", benefit=round(benefit, 3), cost=round(cost, 3))
    reason = (f"saves {natural_wait - ready} ms of level-{job.level} wait on {job.gpus} GPUs;"
              f" victims lose {sum(costs[v].lost_ms for v in victims)} ms of progress")
    if reclaim:
        reason = (f"reclaim: team {job.team} holds {guard.held.get(job.team, 0)} of its fair share"
                  f" {guard.shares[job.team]:.1f} GPUs; {reason}")
    return Plan(
        victims=victims, placement=placement, benefit=round(benefit, 3), cost=round(cost, 3),
        ready_ms=ready, natural_wait_ms=natural_wait,
        checkpoint_needed={v: costs[v].checkpoint_needed for v in victims},
        reason=reason, reclaim=reclaim)


def _gpus_on(victim: Job, node_name: str) -> list[int]:
    for slot in victim.placement:
        if slot.node == node_name:
            return slot.gpus
    return []


class Guard:
    """What a preemption may not take: GPUs a level holds within its guaranteed share of the
    pool and, when the policy guarantees fair shares, jobs of another team that holds no
    more than its fair share (a team's own jobs may still preempt each other by priority).
    `taken` maps a level and a team to the GPUs already chosen from them."""

    def __init__(self, state: State, preemptor: Job, p: Policy) -> None:
        self.state = state
        self.team = preemptor.team
        self.level_floor = [share * state.ix.total_gpus for share in p.guaranteed_share]
        self.guarantees_teams = p.fair_share_guarantee and preemptor.level >= p.fair_share_from_level
        # Shares are only weighed for a preemptor the guarantee covers (an urgent one is not).
        self.shares = fair_shares(state) if self.guarantees_teams else {}
        self.held = holding(state) if self.guarantees_teams else {}

    def allows(self, taken: dict, victim: Job) -> bool:
        floor = self.level_floor[victim.level]
        if floor and self.state.ix.level_gpus[victim.level] - taken.get(victim.level, 0) - victim.gpus < floor:
            return False
        if not self.guarantees_teams or victim.team == self.team:
            return True
        # As in Kueue, a team may be preempted while it holds more than its share (it is
        # borrowing), and its last victim's gang may take it below: a gang is not split.
        held_now = self.held.get(victim.team, 0) - taken.get(victim.team, 0)
        return above_share(held_now, self.shares.get(victim.team, 0.0))

    @staticmethod
    def take(taken: dict, victim: Job) -> None:
        taken[victim.level] = taken.get(victim.level, 0) + victim.gpus
        taken[victim.team] = taken.get(victim.team, 0) + victim.gpus

    def below_share_with(self, job: Job) -> bool:
        """Whether the job's team, holding the job too, stays within its fair share."""
        if not self.guarantees_teams:
            return False
        return within_share(self.held.get(job.team, 0), job.gpus, self.shares.get(job.team, 0.0))



def _cheapest_single_node(state: State, job: Job, nodes, rank: dict[str, float], guard: Guard,
                          cap: int) -> tuple[list[str], list[Slot]] | None:
    best = None
    for node in nodes:
        free = free_indices(node)
        need = job.gpus - len(free)
        if need <= 0 or node.gpus < job.gpus:
            continue
        on_node = sorted((rank[v], v) for v in state.ix.jobs_by_node.get(node.name, {})
                         if v in rank)
        chosen = _greedy_minimal(state, [(score, v, len(_gpus_on(state.c.jobs[v], node.name)))
                                         for score, v in on_node], need, guard)
        if chosen is None or len(chosen) > cap:
            continue
        total = sum(rank[v] for v in chosen)
        key = (total, len(chosen), node.name)
        if best is None or key < best[0]:
            freed = sorted(free + [g for v in chosen for g in _gpus_on(state.c.jobs[v], node.name)])
            best = (key, sorted(chosen), [Slot(node=node.name, gpus=freed[:job.gpus])])
    return None if best is None else (best[1], best[2])


def _cheapest_across_nodes_of_one_model(state: State, job: Job, nodes, rank: dict[str, float],
                                        guard: Guard, cap: int) -> tuple[list[str], list[Slot]] | None:
    """A gang is of one GPU model: the cheapest victim set over the models the job accepts."""
    best = None
    for model in sorted(dict.fromkeys(node.gpu_model for node in nodes)):
        of_model = [node for node in nodes if node.gpu_model == model]
        choice = _cheapest_across_nodes(state, job, of_model, rank, guard, cap)
        if choice is not None:
            key = (sum(rank[v] for v in choice[0]), len(choice[0]), model)
            if best is None or key < best[0]:
                best = (key, choice)
    return None if best is None else best[1]


def _cheapest_across_nodes(state: State, job: Job, nodes, rank: dict[str, float], guard: Guard,
                           cap: int) -> tuple[list[str], list[Slot]] | None:
    free_total = sum(node_free_count(node) for node in nodes)
    need = job.gpus - free_total
    node_names = {node.name: None for node in nodes}
    units = []
    for v in sorted(rank):
        victim = state.c.jobs[v]
        usable = sum(len(s.gpus) for s in victim.placement if s.node in node_names)
        units.append((rank[v] / max(usable, 1), v, usable))
    units.sort()
    chosen = _greedy_minimal(state, units, need, guard)
    if chosen is None or len(chosen) > cap:
        return None
    chosen_map = dict.fromkeys(chosen)
    placement: list[Slot] = []
    needed = job.gpus
    for node in nodes:
        gpus = [i for i, holder in enumerate(node.holder) if holder == "" or holder in chosen_map]
        take = gpus[:needed]
        if take:
            placement.append(Slot(node=node.name, gpus=take))
            needed -= len(take)
        if needed == 0:
            return sorted(chosen), placement
    return None


def _greedy_minimal(state: State, units: list[tuple[float, str, int]], need: int,
                    guard: Guard) -> list[str] | None:
    """Cheapest-first until `need` GPUs are freed, then drop any victim not needed."""
    if need <= 0:
        return []
    chosen: list[tuple[float, str, int]] = []
    taken: dict = {}
    freed = 0
    for unit in units:
        victim = state.c.jobs[unit[1]]
        if not guard.allows(taken, victim):
            continue
        chosen.append(unit)
        guard.take(taken, victim)
        freed += unit[2]
        if freed >= need:
            break
    if freed < need:
        return None
    for unit in sorted(chosen, reverse=True):  # most expensive first
        if freed - unit[2] >= need:
            chosen.remove(unit)
            freed -= unit[2]
    return [unit[1] for unit in chosen]


def natural_wait_ms(state: State, job: Job, nodes, curve: "ReleaseCurve | None" = None) -> int:
    """When would the job fit without preempting, as running jobs finish as estimated: on
    its own (the earliest gang fit), and after the GPUs that jobs served before it ask for
    (queued at more urgent levels, or earlier at its own) have been taken from the pool of
    its models."""
    fit = earliest_fit(state, job, nodes)
    if fit is None:
        return 10 * expected_runtime_ms(state, job)
    ahead = sum(state.ix.queued_gpus[:job.eff_level]) + _same_level_ahead(state, job)
    if ahead == 0:
        return fit[0]
    curve = curve or ReleaseCurve(state, nodes, expected_runtime_ms(state, job))
    return max(fit[0], curve.wait_for(ahead + job.gpus))


def _same_level_ahead(state: State, job: Job) -> int:
    """GPUs asked for by the jobs queued at the job's level before it in queue order (their
    own level, then submit time), whatever their team: in a burst of urgent jobs, the last
    one waits for the releases the first ones take. Counted up to the pool's size, beyond
    which no running job's end tells the wait anyway."""
    c = state.c
    key = queue_key(job)
    cap = state.ix.total_gpus
    total = 0
    for team in sorted(state.ix.queues[job.eff_level]):
        team_queue = state.ix.queues[job.eff_level][team]
        for _, _, other in team_queue[:bisect.bisect_left(team_queue, key)]:
            total += c.jobs[other].gpus
            if total >= cap:
                return total
    return total


def _queued_ahead(state: State, preemptor: Job, level: int) -> int:
    """GPUs asked for by jobs queued at `level` or more urgent, less the preemptor's own
    (it takes the victims' GPUs, not released ones)."""
    ahead = sum(state.ix.queued_gpus[:level + 1])
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
        need = gpus - self.free
        if need <= 0:
            return 0
        i = bisect.bisect_left(self.freed, need)
        on_curve = self.times[i] if i < len(self.times) else self.beyond_ms
        return on_curve if self.pace is None else min(on_curve, int(need / self.pace))


def _remaining_or_runtime(state: State, job_id: str) -> int:
    """Until a holding job releases its GPUs: its remaining time when running, else its
    whole expected runtime. Memoised in the index for the current time (see Index)."""
    ix = state.ix
    if ix.remaining_memo_t != state.c.t:
        ix.remaining_memo.clear()
        ix.remaining_memo_t = state.c.t
    value = ix.remaining_memo.get(job_id)
    if value is None:
        other = state.c.jobs[job_id]
        value = remaining_ms(state, other) if other.state == RUNNING else expected_runtime_ms(state, other)
        ix.remaining_memo[job_id] = value
    return value


def node_releases(state: State, node) -> list[tuple[int, int]]:
    """(ms until release, GPUs) of the jobs holding GPUs on the node, soonest first.
    Memoised for the current time until an event changes the node's jobs (see Index): a
    scheduling pass asks for the same nodes' releases for every job it weighs (natural
    waits, release curves, reservations)."""
    ix = state.ix
    if ix.node_releases_t != state.c.t:
        ix.node_releases.clear()
        ix.node_releases_t = state.c.t
    releases = ix.node_releases.get(node.name)
    if releases is None:
        jobs = state.c.jobs
        releases = sorted((_remaining_or_runtime(state, j), len(_gpus_on(jobs[j], node.name)))
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
