"""Which node holds bind a job, and how many victims one preemption may take.

A hold (a reservation: the starving job's or the head's, see core/passes/placement.py) is a
promise to a queued job. It binds every job of its level or more urgent, and every job
that could not preempt the holder were it running. An urgent job whose level may preempt
the holder's is not bound by it: a promise to a job it could displace once it runs cannot
outrank it while it waits (else a starving level-6 gang holding half the pool keeps a
level-0 emergency off those nodes, where a running level-6 job would not). The holder
keeps its place in line: it starts when the urgent job's GPUs come back.
"""

from __future__ import annotations

from ..forecast.release import expected_runtime_ms
from ..model.placement import node_size_max
from ..model.policy import Policy
from ..model.state import State
from ..model.entities import Job


def overrides_hold(p: Policy, job: Job, holder: Job | None) -> bool:
    """Whether `job` is not bound by a hold for `holder`: it is urgent and its level may
    preempt the holder's."""
    if holder is None or job.level >= p.urgent_levels or not p.urgent_override_holds:
        return False
    return holder.level > job.level and holder.level >= p.preempts_from_level[job.level]


def binding_holds(state: State, job: Job, reserved: dict[str, tuple[int, str]]) -> dict[str, tuple[int, str]]:
    """The holds in `reserved` (node -> (start, holder)) that bind `job`."""
    p = state.canonical.policy
    if job.level >= p.urgent_levels or not p.urgent_override_holds or not reserved:
        return reserved
    jobs = state.canonical.jobs
    return {name: held for name, held in reserved.items() if not overrides_hold(p, job, jobs.get(held[1]))}


HEAD_OWN_LEVEL = "head_reservation_own_level_only"


def may_hold_as_head(p: Policy, job: Job) -> tuple[bool, str]:
    """Whether `job`, first of the serving order not to fit, may hold nodes as the head, and
    why not. With `head_reservation_own_level_only`, a job queued above its own level (aged
    or boosted) holds nothing as the head: it heads a level it does not belong to, and its
    wait stays bounded by the starving job's reservation (every job becomes the oldest).
    An urgent job always may."""
    if p.head_reservation_own_level_only and job.eff_level < job.level and job.level >= p.urgent_levels:
        return False, HEAD_OWN_LEVEL
    return True, ""


def backfill_view(
    state: State, job: Job, t: int, starts: dict[str, int], reserved: dict[str, tuple[int, str]]
) -> tuple[dict[str, int], int, int]:
    """How `job` may backfill under the holds `starts` (node -> the holder's expected start;
    `reserved` names the holders): (the starts as it must see them, its forecast end, the
    shift applied). A job may start on a held node only if forecast to end before the
    holder starts. The forecast is the learned runtime of its team and kind; with
    `backfill_by_own_estimate`, its own estimate (its time limit, as Slurm's backfill reads
    it), except under an urgent holder's hold, where the longer of the two counts: an urgent
    job's wait is not staked on a user's estimate. (That longer forecast is applied by
    moving those holds' starts earlier by the difference, so one end serves every node.)"""
    learned = expected_runtime_ms(state, job)
    p = state.canonical.policy
    if not p.backfill_by_own_estimate:
        return starts, t + learned, 0
    own = job.est_runtime_ms
    shift = learned - own
    if shift <= 0 or not starts:
        return starts, t + own, 0
    jobs = state.canonical.jobs
    urgent = [name for name in starts if name in reserved and _urgent_holder(p, jobs.get(reserved[name][1]))]
    if not urgent:
        return starts, t + own, 0
    view = dict(starts)
    for name in urgent:
        view[name] -= shift
    return view, t + own, shift


def _urgent_holder(p: Policy, holder: Job | None) -> bool:
    return holder is not None and holder.level < p.urgent_levels


VICTIM_CAP = "victims_per_preemption_max"


def victim_cap(state: State, p: Policy, job: Job, models: list[str]) -> int:
    """The most victims one preemption for `job` may take: `victims_per_preemption_max` per
    node its gang needs (a 32-GPU gang on 8-GPU nodes frees four nodes, so it may need four
    times the victims of a one-node job to find room among one-GPU jobs)."""
    size = node_size_max(models, state.index)
    nodes = -(-job.gpus // size) if size > 0 else 1
    return p.victims_per_preemption_max * max(1, nodes)


def describe_cap(p: Policy) -> str:
    """The sentence for a gang no victim set within the cap can free."""
    return (
        f"freeing its gang takes more than victims_per_preemption_max ({p.victims_per_preemption_max})"
        " jobs per node it needs"
    )
