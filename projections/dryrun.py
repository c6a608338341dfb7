"""`submit --dry-run`: what the scheduler would do with a job, decided by the same
`core.step` on a copy of the live state, without sending anything. Where and when it would
start, whom it would preempt (benefit against cost, each victim's lost progress), or why it
would wait and until when, or why it would be refused."""

from __future__ import annotations

from core.model.words import readable_number

import msgspec

from core import step
from core import types as T
from core.explain import explain, human_duration
from core.model.state import copy_state
from core.model.entities import last_checkpoint


def dry_run(state, inp: T.Submit, now_ms: int) -> dict:
    """The outcome of submitting `inp` now, on a copy of `state` (which is left as it was)."""
    copy = copy_state(state)
    t = max(now_ms, copy.canonical.t)
    inp = msgspec.structs.replace(inp, t=t, seq=0)
    victims_before = {j: _victim_row(copy, j) for j in sorted(copy.canonical.jobs)}
    _, records = step(copy, inp)
    events = [r.event for r in records]
    rejected = next((e for e in events if isinstance(e, T.InputRejected)), None)
    if rejected is not None:
        return {
            "outcome": "rejected",
            "job": inp.job,
            "reason": rejected.reason,
            "detail": rejected.detail,
            "summary": f"would be rejected: {rejected.reason}"
            + (f" ({rejected.detail})" if rejected.detail else ""),
        }
    submitted = next(e for e in events if isinstance(e, T.JobSubmitted))
    level_note = (
        f" at level {submitted.level} (downgraded from {submitted.requested_level}: its team"
        " preempted too often)"
        if submitted.level != submitted.requested_level
        else ""
    )
    start = next((e for e in events if isinstance(e, T.JobStartRequested) and e.job == inp.job), None)
    if start is not None:
        where = ", ".join(f"{s.node} GPUs {','.join(map(str, s.gpus))}" for s in start.placement)
        return {
            "outcome": "starts_now",
            "job": inp.job,
            "level": submitted.level,
            "nodes": start.nodes,
            "start_in_s": 0.0,
            "summary": f"would start now{level_note} on {where}",
        }
    plan = next((e for e in events if isinstance(e, T.PreemptionPlanned) and e.preemptor == inp.job), None)
    if plan is not None:
        victims = [victims_before[v] for v in plan.victims]
        ready_s = max(0.0, (plan.deadline_t - t) / 1000)
        return {
            "outcome": "preempts",
            "job": inp.job,
            "level": submitted.level,
            "nodes": plan.victim_nodes,
            "benefit": plan.benefit,
            "cost": plan.cost,
            "reason": plan.reason,
            "victims": victims,
            "reclaim": plan.reclaim,
            "start_in_s": None,
            "deadline_in_s": round(ready_s, 1),
            "lost_s": round(sum(v["lost_s"] for v in victims), 1),
            "summary": f"would preempt {len(victims)} job(s){level_note} on {', '.join(plan.victim_nodes)}:"
            f" benefit {_weighted_gpu_h(plan.benefit)} > cost {_weighted_gpu_h(plan.cost)}"
            " level-weighted GPU-hours (the cost counts the victims' lost progress"
            f" - {human_duration(int(sum(v['lost_s'] for v in victims) * 1000))} in all -, their saves,"
            f" restores and requeue waits; {plan.reason}); it starts once they release, at the"
            f" latest in {human_duration(int(ready_s * 1000))}",
        }
    why = explain(copy, inp.job)
    when = (
        "never, as the pool stands"
        if why.start_in_ms is None
        else f"in about {human_duration(why.start_in_ms)}"
    )
    return {
        "outcome": "waits",
        "job": inp.job,
        "level": submitted.level,
        "reason_code": why.code,
        "reason": why.reason,
        "limit": why.limit,
        "benefit": why.benefit,
        "cost": why.cost,
        "start_in_s": None if why.start_in_ms is None else round(why.start_in_ms / 1000, 1),
        "summary": f"would wait{level_note} ({why.code}: {why.reason}); expected start {when}",
    }


def _weighted_gpu_h(gpu_seconds: float) -> str:
    """Level-weighted GPU-seconds (the unit of benefit and cost) in GPU-hours, no exponent."""
    return readable_number(gpu_seconds / 3600)


def _victim_row(state, job_id: str) -> dict:
    from core.model.entities import job_progress_ms

    job = state.canonical.jobs[job_id]
    ckpt = last_checkpoint(job)
    progress = job_progress_ms(job, state.canonical.t)
    saved = ckpt.progress_ms if ckpt else 0
    return {
        "job": job_id,
        "team": job.team,
        "user": job.user,
        "level": job.level,
        "gpus": job.gpus,
        "lost_s": round(max(0, progress - saved) / 1000, 1),
    }
