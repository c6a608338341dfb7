"""Why a queued job waits, and when it is expected to start: a pure reader of the state.

`explain(state, job_id)` gives a reason code and a sentence, in the spirit of Slurm's
`Priority`, `Resources` and `QOS...Limit` reasons but in xirang's terms: a job that can
never run (no node of its model, a gang larger than its models' pool), a job behind GPUs
asked for by more urgent levels, one waiting for GPUs to free, one whose team is at its
fair share, one whose preemption was declined (benefit against cost) or found no victim
set within the fairness limits, naming the limit. The expected start comes from the same
remaining-time estimates the preemption decision uses.

It never changes what `step` decides nor what the log holds: it reads the state (the
scratch's memoised release times are caches of that state) and emits nothing. Commands,
the dashboard and the projection call it on a state they folded themselves.
"""

from __future__ import annotations

import msgspec

from .model.cordon import NODE_CORDONED, cordon_words, schedulable, takes_work
from .model.placement import acceptable_models, place
from .forecast.waits import natural_wait_ms
from .model.words import human_duration
from .passes.placement import reserved_nodes
from .passes.plan import Decline, plan_preemption
from .rules import guarantees, rights, shields
from .rules.benefit import describe as benefit_words
from .rules.decision import Decision
from .rules.eligibility import HELD_NODE
from .rules.recovery import describe_band
from .rules.rights import may_preempt
from .rules.fairness import USER_PREEMPTING, describe_user_preempting
from .rules.holds import (
    HEAD_OWN_LEVEL,
    VICTIM_CAP,
    backfill_view,
    binding_holds,
    describe_cap,
    may_hold_as_head,
)
from .rules.shares import fair_shares, holding, lent_gpus, reclaim_refusal, teams_below_share, within_share
from .model.entities import HELD as HELD_STATE
from .model.state import State
from .model.entities import QUEUED, RESERVED, Job, node_free_count
from .model.types import LEVELS

# Reason codes, most specific first. `limit` names the policy parameter behind a
# fairness or guarantee reason.
NO_NODE_OF_MODEL = "no_node_of_model"
# NODE_CORDONED (core/model/cordon.py): the nodes it could start on take no new work.
GANG_TOO_LARGE = "gang_too_large"
HELD = "held"
PREEMPTING = "preempting"
RETRY_BACKOFF = "retry_backoff"
STARTS_NEXT_PASS = "starts_next_pass"
PREEMPTION_NEXT_PASS = "preemption_next_pass"
FAIRNESS_LIMIT = "fairness_limit"
PREEMPTION_DECLINED = "preemption_declined"
RESERVATION = "reservation"
TEAM_AT_SHARE = "team_at_share"
PRIORITY = "priority"
RESOURCES = "resources"


class Pending(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Why one job waits: a reason code, a sentence, the limit that blocks it and, when known,
    when it will start."""

    job: str
    code: str
    reason: str
    # Expected wait from the state's time until the job starts; None when it never can.
    start_in_ms: int | None = None
    limit: str = ""  # the rule that blocks it: a policy parameter or a victim's shield
    benefit: float | None = None
    cost: float | None = None
    # The preemption decision's reason for not preempting for it now (what the log records
    # as `PreemptionDeclined.reason`); "" when it has no right to preempt or reclaim.
    decline: str = ""


def explain_queue(state: State, job_ids: list[str] | None = None) -> dict[str, Pending]:
    """Every waiting (queued, held, or preempting-for) job's reason, by job id, sorted; or
    those of `job_ids`."""
    c = state.canonical
    names = sorted(c.jobs) if job_ids is None else job_ids
    return {
        job_id: explain(state, job_id)
        for job_id in names
        if c.jobs[job_id].state in (QUEUED, RESERVED, HELD_STATE)
    }


def explain(state: State, job_id: str) -> Pending:
    """Why the job `job_id` is not running now (a pure read of the state: nothing is decided or
    changed)."""
    pending = _explain(state, job_id)
    job = state.canonical.jobs[job_id]
    if job.state == QUEUED:
        p = state.canonical.policy
        head = (
            "" if may_hold_as_head(p, job)[0] else "queued above its own level, it holds no nodes as the head"
        )
        for words in (describe_band(p, job), head and f"{head} ({HEAD_OWN_LEVEL})"):
            if words:
                pending.reason = f"{pending.reason}; {words}"
    return pending


def _explain(state: State, job_id: str) -> Pending:
    c = state.canonical
    job = c.jobs[job_id]
    if job.state == RESERVED:
        saga = c.sagas.get(job.saga)
        left = len(saga.victims) - len(saga.released) if saga else 0
        return Pending(
            job=job_id,
            code=PREEMPTING,
            start_in_ms=max(0, saga.deadline_t - c.t) if saga else 0,
            reason=f"its preemption {job.saga} is under way: waiting for {left} victim(s) to"
            " reach a safe point and release",
        )
    if job.state == HELD_STATE:
        return Pending(job=job_id, code=HELD, reason=f"held: `xirang release {job_id}` lets it be scheduled")
    impossible = _impossible(state, job)
    if impossible:
        # The most specific reason; the decision's decline (it may still try) rides along.
        impossible.decline = _why_no_preemption(state, job)[1]
        return impossible
    models = acceptable_models(job.gpu_models, state.index)
    nodes = _nodes_of(state, models)
    start_in = natural_wait_ms(state, job, nodes)
    waiting = _why_no_gpus(state, job, models, start_in)
    preempting, decline = _why_no_preemption(state, job)
    if preempting is None:
        waiting.decline = decline
        return waiting
    if preempting.code == PREEMPTION_NEXT_PASS:
        return preempting
    return Pending(
        job=job_id,
        code=preempting.code,
        limit=preempting.limit,
        benefit=preempting.benefit,
        cost=preempting.cost,
        start_in_ms=waiting.start_in_ms,
        reason=f"{waiting.reason}; {preempting.reason}",
        decline=decline,
    )


def _impossible(state: State, job: Job) -> Pending | None:
    ix = state.index
    models = acceptable_models(job.gpu_models, ix)
    up = [m for m in models if ix.capacity_by_model.get(m, 0) > 0]
    cordoned = _cordoned_of(state, models)
    capacity = max((ix.capacity_by_model.get(m, 0) for m in up), default=0)  # a gang stays on one model
    capacity_uncordoned = {m: ix.capacity_by_model.get(m, 0) for m in models}
    for node in cordoned:
        capacity_uncordoned[node.gpu_model] += node.gpus
    if job.gpus > capacity and any(gpus >= job.gpus for gpus in capacity_uncordoned.values()):
        return Pending(
            job=job.id,
            code=NODE_CORDONED,
            reason=f"the nodes of its models that could hold its {job.gpus} GPUs are cordoned:"
            f" {_cordon_words(cordoned)}; no new work lands there until they are uncordoned",
        )
    if not up:
        have = ", ".join(sorted(m for m, n in ix.capacity_by_model.items() if n)) or "none"
        return Pending(
            job=job.id,
            code=NO_NODE_OF_MODEL,
            reason=f"no node of model {' or '.join(job.gpu_models) or 'any'} is up"
            f" (models up: {have}): it starts when one joins",
        )
    if job.gpus > capacity:
        return Pending(
            job=job.id,
            code=GANG_TOO_LARGE,
            reason=f"asks for {job.gpus} GPUs but the nodes up of any one model ({', '.join(up)})"
            f" hold at most {capacity}: it cannot start until more join",
        )
    return None


def _nodes_of(state: State, models: list[str]) -> list:
    c = state.canonical
    return [
        c.nodes[name]
        for name in sorted(c.nodes)
        if takes_work(c.nodes[name]) and c.nodes[name].gpu_model in models
    ]


def _cordoned_of(state: State, models: list[str]) -> list:
    """The nodes of these models that are up but take no new work (`cordon.schedulable`)."""
    c = state.canonical
    return [
        c.nodes[name]
        for name in sorted(c.nodes)
        if schedulable(c.nodes[name])[1] == NODE_CORDONED and c.nodes[name].gpu_model in models
    ]


def _cordon_words(nodes: list) -> str:
    return ", ".join(cordon_words(node) for node in nodes)


def _why_no_gpus(state: State, job: Job, models: list[str], start_in: int) -> Pending:
    """Why its gang does not start now, preemption aside."""
    c = state.canonical
    ix = state.index
    free = sum(ix.free_by_model.get(m, 0) for m in models)
    what = f"{job.gpus} GPU{'s' if job.gpus != 1 else ''} of {'/'.join(models)}"
    # The holds are the last pass's own (`reserved_nodes`), those that bind this job as they
    # bind it in the pass (`binding_holds`): what it is told is what the pass decided.
    reserved = reserved_nodes(state)
    if place(job.gpus, models, c.nodes, ix) is not None:
        binding = binding_holds(state, job, reserved)
        held = {name: start for name, (start, holder) in binding.items() if holder != job.id}
        held, ends_t, _ = backfill_view(state, job, c.t, held, binding)
        if held and place(job.gpus, models, c.nodes, ix, held, ends_t) is None:
            holders = [c.jobs[h] for h in sorted({binding[name][1] for name in held}) if h in c.jobs]
            return Pending(
                job=job.id,
                code=RESERVATION,
                start_in_ms=start_in,
                reason=f"{what} are free but held for {_holders_words(state, holders)}",
            )
        return Pending(
            job=job.id,
            code=STARTS_NEXT_PASS,
            start_in_ms=0,
            reason=f"{what} are free: it starts at the scheduler's next pass",
        )
    cordoned = [node for node in _cordoned_of(state, models) if node_free_count(node)]
    if cordoned and free + sum(node_free_count(node) for node in cordoned) >= job.gpus:
        return Pending(
            job=job.id,
            code=NODE_CORDONED,
            start_in_ms=start_in,
            reason=f"needs {what}, {free} free; the free GPUs it could use are on cordoned nodes,"
            f" where no new work lands: {_cordon_words(cordoned)}",
        )
    if any(holder == job.id for _, holder in reserved.values()):
        return Pending(
            job=job.id,
            code=RESERVATION,
            start_in_ms=start_in,
            reason=f"waiting for its reservation: the nodes where it fits soonest are held for it"
            f" ({free} free now)",
        )
    if _team_at_share(state, job):
        shares = fair_shares(state)
        team_held = holding(state).get(job.team, 0)
        return Pending(
            job=job.id,
            code=TEAM_AT_SHARE,
            limit="fair_share_guarantee",
            start_in_ms=start_in,
            reason=f"team {job.team} holds {team_held} GPUs, its fair share is"
            f" {shares.get(job.team, 0.0):.1f}: teams below their shares are served"
            " first",
        )
    urgent = sum(ix.queued_gpus[: job.eff_level])
    if urgent:
        jobs = sum(ix.queued_count[: job.eff_level])
        return Pending(
            job=job.id,
            code=PRIORITY,
            start_in_ms=start_in,
            reason=f"behind {urgent} GPUs asked for by {jobs} job(s) of more urgent"
            f" levels; needs {what}, {free} free",
        )
    return Pending(
        job=job.id,
        code=RESOURCES,
        start_in_ms=start_in,
        reason=f"needs {what}, {free} free: running jobs are expected to free them in {_human(start_in)}",
    )


def _holders_words(state: State, holders: list[Job]) -> str:
    """Who the last pass held nodes for, and why: past `starvation_wait_ms`, or at the head
    of its level's queue."""
    c = state.canonical
    p = c.policy
    words = []
    for holder in holders:
        starving = c.t - holder.queued_since_t >= p.starvation_wait_ms
        why = (
            f"waited past starvation_wait_ms ({_human(p.starvation_wait_ms)})"
            if starving
            else "heads its level"
        )
        words.append(f"{holder.id} (which {why})")
    return ", ".join(words) or "another job"


def _team_at_share(state: State, job: Job) -> bool:
    """Whether the placement pass serves other teams' jobs first: the guarantee covers the
    job's level, its team would go beyond its share, and another team waits below its own
    (`teams_below_share`, the list the pass serves first)."""
    p = state.canonical.policy
    if not p.fair_share_guarantee or job.level < p.fair_share_from_level:
        return False
    shares, held, below = teams_below_share(state)
    if within_share(held.get(job.team, 0), job.gpus, shares.get(job.team, 0.0)):
        return False
    return any(team != job.team for team in below)


def _why_no_preemption(state: State, job: Job) -> tuple[Pending | None, str]:
    """For a job with a right to preempt (or to reclaim): what the decision model says now,
    and the reason code of its decline ("" when it made none)."""
    c = state.canonical
    if job.preempt_retry_t > c.t:
        return Pending(
            job=job.id,
            code=RETRY_BACKOFF,
            reason=f"its last preemption rolled back: it tries again in"
            f" {_human(job.preempt_retry_t - c.t)} (preemption_retry_ms)",
        ), ""
    reclaim = _may_reclaim(state, job)
    by_priority = may_preempt(state.canonical.policy, job.level)
    if not by_priority and not reclaim:
        return None, ""
    outcome = plan_preemption(state, job, reclaim=not by_priority, diagnose=True)
    if not isinstance(outcome, Decline):
        victims = ", ".join(outcome.victims)
        return Pending(
            job=job.id,
            code=PREEMPTION_NEXT_PASS,
            start_in_ms=outcome.ready_ms,
            benefit=outcome.benefit,
            cost=outcome.cost,
            reason=f"preempting {victims} is worth it (benefit {outcome.benefit:.0f} >"
            f" cost {outcome.cost:.0f}): planned at the next tick",
        ), ""
    return _decline_reason(state, job, outcome, not by_priority), outcome.reason


def _may_reclaim(state: State, job: Job) -> bool:
    """Whether the reclaim pass would consider the job (`core.rules.shares.reclaim_refusal`)."""
    p = state.canonical.policy
    if not p.fair_share_guarantee or job.level < p.fair_share_from_level:
        return False
    shares = fair_shares(state)
    held = holding(state)
    return not reclaim_refusal(p, job, shares, held, lent_gpus(shares, held))


def _decline_reason(state: State, job: Job, decline: Decline, reclaim: bool) -> Pending | None:
    """The decision's decline in words: each rule's sentence comes from the module of the
    rule (`decline.limit`, found by the plan itself when asked to diagnose)."""
    d = Decision(state, job, reclaim)
    reason, limit = decline.reason, decline.limit
    blocked = [state.canonical.jobs[job_id] for job_id in decline.blocked]
    if reason == "benefit_below_cost":
        return Pending(
            job=job.id,
            code=PREEMPTION_DECLINED,
            benefit=decline.benefit,
            cost=decline.cost,
            limit=limit,
            reason=f"preemption declined: {benefit_words(d.policy, decline.benefit, decline.cost)}",
        )
    if reason == "reclaim_beyond_share":
        return Pending(
            job=job.id,
            code=TEAM_AT_SHARE,
            limit=limit,
            reason=f"no reclaim: team {job.team} would go beyond its fair share",
        )
    if reason not in _PREEMPTION_BLOCKED:
        return None  # fits_without_preemption, no_node_of_model: the waiting reason says it
    code = FAIRNESS_LIMIT if limit in _FAIRNESS_RULES else RESERVATION if limit == HELD_NODE else PRIORITY
    lead = "no victim set within the limits" if reason == "no_victim_set_within_limits" else "no preemption"
    return Pending(job=job.id, code=code, limit=limit, reason=f"{lead}: {_rule_words(d, limit, blocked)}")


# The declines a rule explains (`Decline.limit`).
_PREEMPTION_BLOCKED = (
    "user_preempting_limit",
    "preemption_depth_limit",
    "no_eligible_victims",
    "no_victim_set_within_limits",
    "held_back_by_reservation",
)
# Rules that limit preemption for fairness (they lift with time or with the shares).
_FAIRNESS_RULES = (
    shields.TEAM_PROTECTED,
    shields.USER_PROTECTED,
    USER_PREEMPTING,
    rights.DEPTH,
    rights.LEVELS_DOWN,
    guarantees.TEAM_SHARE,
    guarantees.LEVEL_SHARE,
    VICTIM_CAP,
)


def _rule_words(d: Decision, limit: str, blocked: list[Job]) -> str:
    """The sentence of the rule `limit` for the jobs it keeps from being victims."""
    if limit == USER_PREEMPTING:
        return describe_user_preempting(d.state, d.job)
    if limit == VICTIM_CAP:
        return describe_cap(d.policy)
    if limit in (guarantees.TEAM_SHARE, guarantees.LEVEL_SHARE):
        return guarantees.describe(limit, blocked)
    if limit == HELD_NODE:
        return "the nodes it could preempt on are held for a starving job"
    if limit in (rights.PREEMPTS_FROM_LEVEL, rights.LEVELS_DOWN, rights.RECLAIM_LEVELS, rights.DEPTH):
        if not blocked and limit == rights.PREEMPTS_FROM_LEVEL:
            first = d.policy.preempts_from_level[d.job.level]
            may = f"levels {first}-{LEVELS - 1}" if first < LEVELS else "no level"
            return f"nothing runs on its GPU models at the levels it may preempt ({may}, preempts_from_level)"
        levels = sorted(dict.fromkeys(v.level for v in blocked))
        return rights.describe(d.policy, d.job, limit, levels, d.levels_down_max)
    if limit == rights.OWN_OR_MORE_URGENT:
        return rights.describe(d.policy, d.job, limit, sorted(dict.fromkeys(v.level for v in blocked)), 0)
    return f"the jobs it could preempt are shielded: {shields.describe(d, limit, blocked)}"


_human = human_duration
