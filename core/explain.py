"""Why a queued job waits, and when it is expected to start: a pure reader of the state.

`explain(state, job_id)` gives a reason code and a sentence, in the spirit of Slurm's
`Priority`, `Resources` and `QOS...Limit` reasons but in xirang's terms: a job that can
never run (no node of its model, a gang larger than its models' pool), a job behind GPUs
asked for by more urgent levels, one waiting for GPUs to free, one whose team is at its
fair share, one whose preemption was declined (benefit against cost) or found no victim
set within the fairness limits, naming the limit. The expected start comes from the same
remaining-time estimates the preemption decision uses.

It never changes what `step` decides nor what the log holds: it reads the state (the
index's memoised release times are caches of that state) and emits nothing. Commands,
the dashboard and the projection call it on a state they folded themselves.
"""

from __future__ import annotations

import msgspec

from .model.placement import acceptable_models, place
from .forecast.waits import expected_runtime_ms, natural_wait_ms
from .passes.plan import Decline, plan_preemption, variant_policy
from .rules.eligibility import may_preempt
from .rules.fairness import Guard, scaled_limit, team_limit
from .rules.shares import above_share, fair_shares, holding, within_share
from .model.state import HELD as HELD_STATE
from .model.state import QUEUED, RESERVED, RUNNING, Job, State, window_count
from .model.types import LEVELS

# Reason codes, most specific first. `limit` names the policy parameter behind a
# fairness or guarantee reason.
NO_NODE_OF_MODEL = "no_node_of_model"
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
    limit: str = ""  # the policy parameter that blocks it, for fairness and guarantees
    benefit: float | None = None
    cost: float | None = None


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
        return impossible
    models = acceptable_models(job.gpu_models, state.index)
    nodes = _nodes_of(state, models)
    start_in = natural_wait_ms(state, job, nodes)
    waiting = _why_no_gpus(state, job, models, start_in)
    preempting = _why_no_preemption(state, job)
    if preempting is None:
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
    )


def _impossible(state: State, job: Job) -> Pending | None:
    ix = state.index
    models = acceptable_models(job.gpu_models, ix)
    up = [m for m in models if ix.capacity_by_model.get(m, 0) > 0]
    if not up:
        have = ", ".join(sorted(m for m, n in ix.capacity_by_model.items() if n)) or "none"
        return Pending(
            job=job.id,
            code=NO_NODE_OF_MODEL,
            reason=f"no node of model {' or '.join(job.gpu_models) or 'any'} is up"
            f" (models up: {have}): it starts when one joins",
        )
    capacity = max(ix.capacity_by_model.get(m, 0) for m in up)  # a gang stays on one model
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
        c.nodes[name] for name in sorted(c.nodes) if c.nodes[name].up and c.nodes[name].gpu_model in models
    ]


def _why_no_gpus(state: State, job: Job, models: list[str], start_in: int) -> Pending:
    """Why its gang does not start now, preemption aside."""
    c = state.canonical
    ix = state.index
    p = c.policy
    free = sum(ix.free_by_model.get(m, 0) for m in models)
    what = f"{job.gpus} GPU{'s' if job.gpus != 1 else ''} of {'/'.join(models)}"
    if place(job.gpus, models, c.nodes, ix, ends_t=c.t + expected_runtime_ms(state, job)) is not None:
        holder = _starving_holder(state)
        if holder and holder != job.id:
            return Pending(
                job=job.id,
                code=RESERVATION,
                start_in_ms=start_in,
                reason=f"{what} are free but held for {holder}, which has waited past"
                f" starvation_wait_ms ({_human(p.starvation_wait_ms)})",
            )
        return Pending(
            job=job.id,
            code=STARTS_NEXT_PASS,
            start_in_ms=0,
            reason=f"{what} are free: it starts at the scheduler's next pass",
        )
    if _starving_holder(state) == job.id:
        return Pending(
            job=job.id,
            code=RESERVATION,
            start_in_ms=start_in,
            reason=f"waiting for its reservation: it has waited past starvation_wait_ms"
            f" ({_human(p.starvation_wait_ms)}), so the nodes where it fits soonest"
            f" are held for it ({free} free now)",
        )
    if _team_at_share(state, job):
        shares = fair_shares(state)
        held = holding(state).get(job.team, 0)
        return Pending(
            job=job.id,
            code=TEAM_AT_SHARE,
            limit="fair_share_guarantee",
            start_in_ms=start_in,
            reason=f"team {job.team} holds {held} GPUs, its fair share is"
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


def _starving_holder(state: State) -> str:
    """The oldest queued job past `starvation_wait_ms`, for which the scheduler holds nodes."""
    c = state.canonical
    oldest = min(
        ((waiting[0][0], waiting[0][1]) for waiting in state.index.waiting_by_level if waiting), default=None
    )
    if oldest is None:
        return ""
    job = c.jobs[oldest[1]]
    return job.id if c.t - job.queued_since_t >= c.policy.starvation_wait_ms else ""


def _team_at_share(state: State, job: Job) -> bool:
    p = state.canonical.policy
    if not p.fair_share_guarantee or job.level < p.fair_share_from_level:
        return False
    shares = fair_shares(state)
    held = holding(state)
    if within_share(held.get(job.team, 0), job.gpus, shares.get(job.team, 0.0)):
        return False
    return any(
        team != job.team and within_share(held.get(team, 0), 1, shares.get(team, 0.0))
        for team in sorted(state.index.waiting_by_team)
    )


def _why_no_preemption(state: State, job: Job) -> Pending | None:
    """For a job with a right to preempt (or to reclaim): what the decision model says now."""
    c = state.canonical
    if job.preempt_retry_t > c.t:
        return Pending(
            job=job.id,
            code=RETRY_BACKOFF,
            reason=f"its last preemption rolled back: it tries again in"
            f" {_human(job.preempt_retry_t - c.t)} (preemption_retry_ms)",
        )
    reclaim = _may_reclaim(state, job)
    if not may_preempt(state, job) and not reclaim:
        return None
    outcome = plan_preemption(state, job, reclaim=reclaim and not may_preempt(state, job))
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
        )
    return _decline_reason(state, job, outcome)


def _may_reclaim(state: State, job: Job) -> bool:
    p = state.canonical.policy
    if not p.fair_share_guarantee or job.level < p.fair_share_from_level:
        return False
    shares = fair_shares(state)
    held = holding(state)
    return within_share(held.get(job.team, 0), job.gpus, shares.get(job.team, 0.0)) and any(
        above_share(held.get(team, 0), share) for team, share in shares.items() if team != job.team
    )


def _decline_reason(state: State, job: Job, decline: Decline) -> Pending | None:
    c = state.canonical
    p = variant_policy(state, job)
    reason = decline.reason
    if reason == "benefit_below_cost":
        return Pending(
            job=job.id,
            code=PREEMPTION_DECLINED,
            benefit=decline.benefit,
            cost=decline.cost,
            reason=f"preemption declined: the wait it would save is worth {decline.benefit:.0f},"
            f" the victims' loss {decline.cost:.0f} (net_benefit_min"
            f" {p.net_benefit_min:g})",
        )
    if reason == "user_preempting_limit":
        count = _window(c.user_windows.get(job.user), "preempting", c.t, p.fairness_window_ms)
        return Pending(
            job=job.id,
            code=FAIRNESS_LIMIT,
            limit="user_preempting_max",
            reason=f"no preemption: user {job.user} has preempted others' jobs {count} times"
            f" in the last {_human(p.fairness_window_ms)}, the limit"
            f" (user_preempting_max, scaled to the pool) is"
            f" {scaled_limit(state, p.user_preempting_max)}",
        )
    if reason == "no_eligible_victims":
        return _no_eligible(state, job, p)
    if reason == "no_victim_set_within_limits":
        return _no_set_within_limits(state, job, p)
    if reason == "held_back_by_reservation":
        return Pending(
            job=job.id,
            code=RESERVATION,
            reason="no preemption: the nodes it could preempt on are held for a starving job",
        )
    if reason == "reclaim_beyond_share":
        return Pending(
            job=job.id,
            code=TEAM_AT_SHARE,
            limit="fair_share_guarantee",
            reason=f"no reclaim: team {job.team} would go beyond its fair share",
        )
    return None  # fits_without_preemption, no_node_of_model: the waiting reason says it


def _no_eligible(state: State, job: Job, p) -> Pending:
    """No running job may be preempted by this one: say which rule or limit shields them."""
    c = state.canonical
    t = c.t
    first = max(p.preempts_from_level[job.level], job.level + 1)
    models = acceptable_models(job.gpu_models, state.index)
    shielded: dict[str, list[str]] = {}
    for level in range(first, LEVELS):
        for victim_id in sorted(state.index.holding_by_level[level]):
            victim = c.jobs[victim_id]
            if not any(c.nodes[s.node].gpu_model in models for s in victim.placement):
                continue
            shielded.setdefault(_shield(state, job, victim), []).append(victim.team)
    if not shielded:
        levels = f"levels {first}-{LEVELS - 1}" if first < LEVELS else "no level"
        return Pending(
            job=job.id,
            code=PRIORITY,
            limit="preempts_from_level",
            reason=f"no preemption: nothing runs on its GPU models at the levels it may"
            f" preempt ({levels}, preempts_from_level)",
        )
    # A limit that shields any of them is what to name: jobs busy in another preemption
    # free up on their own.
    limit = next(name for name in SHIELDS if name in shielded)
    teams = sorted(dict.fromkeys(shielded[limit]))
    words = {
        "team_preempted_max": lambda: (
            "their teams ({}) were preempted {} times in the last {} and are"
            " protected (team_preempted_max, limit {}) until {}".format(
                ", ".join(teams),
                _window(c.team_windows.get(teams[0]), "preempted", t, p.fairness_window_ms),
                _human(p.fairness_window_ms),
                team_limit(state, teams[0], p.team_preempted_max),
                "in " + _human(c.team_protected_until.get(teams[0], t) - t),
            )
        ),
        "user_preempted_max": lambda: (
            "their users were preempted too often (user_preempted_max, limit"
            f" {scaled_limit(state, p.user_preempted_max)} in"
            f" {_human(p.fairness_window_ms)})"
        ),
        "min_run_after_restart_ms": lambda: (
            "they restarted lately and are protected (min_run_after_restart_ms)"
        ),
        "not_preemptible": lambda: "they were submitted not preemptible",
        "busy": lambda: "they are starting or already in a preemption",
    }
    code = FAIRNESS_LIMIT if limit in ("team_preempted_max", "user_preempted_max") else PRIORITY
    return Pending(
        job=job.id,
        code=code,
        limit=limit if limit in SHIELDS[:3] else "",
        reason=f"no preemption: the jobs it could preempt are shielded: {words[limit]()}",
    )


SHIELDS = ("team_preempted_max", "user_preempted_max", "min_run_after_restart_ms", "not_preemptible", "busy")


def _shield(state: State, preemptor: Job, victim: Job) -> str:
    """The first rule that keeps a running job from being this preemptor's victim (the order
    of `victim_preemptible_now`)."""
    c = state.canonical
    if victim.state != RUNNING or victim.saga:
        return "busy"
    if not victim.preemptible:
        return "not_preemptible"
    if victim.protected_until_t > c.t:
        return "min_run_after_restart_ms"
    if victim.team != preemptor.team and c.team_protected_until.get(victim.team, 0) > c.t:
        return "team_preempted_max"
    return "user_preempted_max"


def _no_set_within_limits(state: State, job: Job, p) -> Pending:
    """Victims exist, but no set of them frees a gang within the guarantees and the cap."""
    guard = Guard(state, job, p)
    c = state.canonical
    first = max(p.preempts_from_level[job.level], job.level + 1)
    candidates = [
        c.jobs[v] for level in range(first, LEVELS) for v in sorted(state.index.holding_by_level[level])
    ]
    guarded = [v for v in candidates if not guard.allows({}, v)]
    if guarded and len(guarded) * 2 >= len(candidates):
        by_share = [v for v in guarded if guard.guarantees_teams and v.team != job.team]
        if by_share:
            teams = ", ".join(sorted(dict.fromkeys(v.team for v in by_share)))
            return Pending(
                job=job.id,
                code=FAIRNESS_LIMIT,
                limit="fair_share_guarantee",
                reason=f"no victim set within the fairness limits: the teams it could"
                f" preempt ({teams}) hold no more than their fair shares"
                " (fair_share_guarantee)",
            )
        return Pending(
            job=job.id,
            code=FAIRNESS_LIMIT,
            limit="guaranteed_share",
            reason="no victim set within the fairness limits: the levels it could preempt"
            " hold no more than their guaranteed shares (guaranteed_share)",
        )
    return Pending(
        job=job.id,
        code=FAIRNESS_LIMIT,
        limit="victims_per_preemption_max",
        reason=f"no victim set within the fairness limits: freeing its gang takes more"
        f" than victims_per_preemption_max ({p.victims_per_preemption_max}) jobs per node it needs",
    )


def _window(win, field: str, t: int, window_ms: int) -> int:
    return window_count(getattr(win, field), t, window_ms) if win is not None else 0


def _human(ms: int) -> str:
    """A duration as people say it: 45s, 12m, 1h12m, 2d3h."""
    if 0 < ms < 10_000 and ms % 1000:
        return f"{ms / 1000:.1f}s"
    seconds = max(0, int(ms // 1000))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s" if seconds and minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


human_duration = _human
