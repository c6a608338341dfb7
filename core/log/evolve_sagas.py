"""How events change preemption sagas and what follows them: planned, victims released,
committed, rolled back; the fairness windows, team protection and downgrades, and the
compensation ledger (handlers of `core.log.evolve`).
"""

from __future__ import annotations

import typing
from ..model import types as T
from .evolve_jobs import _free_slots, _vacate
from ..model.state import (
    State,
    hold_add,
    hold_remove,
    queue_add,
    queue_remove,
    set_holder,
)
from ..model.entities import (
    PREEMPTING,
    QUEUED,
    RELEASED,
    RESERVED,
    RUNNING,
    Ledger,
    Saga,
    Window,
    job_progress_ms,
)


def _preemption_planned(s: State, ev: T.PreemptionPlanned) -> None:
    c = s.canonical
    preemptor = c.jobs[ev.preemptor]
    queue_remove(s.index, s.scratch, preemptor)
    hold_add(s.index, preemptor)
    preemptor.state = RESERVED
    preemptor.saga = ev.saga
    preemptor.placement = list(ev.placement)
    for slot in ev.placement:
        node = c.nodes[slot.node]
        for gpu in slot.gpus:
            if node.holder[gpu] == "":
                set_holder(c, s.index, s.scratch, slot.node, gpu, preemptor.id)
    # The fairness windows count what a team or user does to others: reordering one's own
    # work (an urgent job displacing its own team's, or its own user's, batch job) is not
    # counted against either side (in logs that record so: `own_work_counted`).
    other_team = other_user = ev.own_work_counted
    for victim_id in ev.victims:
        victim = c.jobs[victim_id]
        victim.state = PREEMPTING
        victim.saga = ev.saga
        victim.overdue_saga = ""
        victim.cascade_depth = ev.depth
        if ev.own_work_counted or victim.team != preemptor.team:
            other_team = True
            if not ev.reclaim:
                _window(c.team_windows, victim.team).preempted.append(ev.t)
        if ev.own_work_counted or victim.user != preemptor.user:
            other_user = True
            _window(c.user_windows, victim.user).preempted.append(ev.t)
    if preemptor.level < c.policy.downgrade_applies_below_level and not ev.reclaim and other_team:
        # The team limit guards the levels its penalty (a downgrade) applies to: a team's
        # mid-level jobs preempting on their own merits do not cost its urgent jobs a level.
        _window(c.team_windows, preemptor.team).preempting.append(ev.t)
    if other_user:
        _window(c.user_windows, preemptor.user).preempting.append(ev.t)
    _prune_windows(c, ev.t)
    c.sagas[ev.saga] = Saga(
        id=ev.saga,
        preemptor=ev.preemptor,
        victims=list(ev.victims),
        released=[],
        placement=list(ev.placement),
        deadline_t=ev.deadline_t,
        planned_t=ev.t,
        benefit=ev.benefit,
        cost=ev.cost,
        reclaim=ev.reclaim,
    )
    c.saga_count += 1


def _window(windows: dict[str, Window], key: str) -> Window:
    win = windows.get(key)
    if win is None:
        win = windows[key] = Window()
    return win


def _prune_windows(c, t: int) -> None:
    start = t - c.policy.fairness_window_ms
    for windows in (c.team_windows, c.user_windows):
        for key in sorted(windows):
            win = windows[key]
            win.preempting = [x for x in win.preempting if x > start]
            win.preempted = [x for x in win.preempted if x > start]
            if not win.preempting and not win.preempted:
                del windows[key]


def _victim_released(s: State, ev: T.VictimReleased) -> None:
    c = s.canonical
    saga = c.sagas[ev.saga]
    victim = c.jobs[ev.job]
    victim.progress_ms = job_progress_ms(victim, ev.t)
    victim.run_started_t = 0
    victim.frozen_t = 0
    _vacate(s, victim)
    hold_remove(s.index, victim)
    victim.state = RELEASED
    for slot in victim.placement:
        for gpu in slot.gpus:
            set_holder(c, s.index, s.scratch, slot.node, gpu, saga.preemptor)
    wanted = {(slot.node, gpu): None for slot in saga.placement for gpu in slot.gpus}
    for slot in victim.placement:
        extra = [gpu for gpu in slot.gpus if (slot.node, gpu) not in wanted]
        if extra:
            saga.held_extra.append(T.Slot(node=slot.node, gpus=extra))
    saga.released.append(ev.job)


def _free_held_extra(s: State, saga: Saga) -> None:
    _free_slots(s, saga.held_extra, saga.preemptor)


def _preemption_committed(s: State, ev: T.PreemptionCommitted) -> None:
    _free_held_extra(s, s.canonical.sagas.pop(ev.saga))


def _preemption_rolled_back(s: State, ev: T.PreemptionRolledBack) -> None:
    c = s.canonical
    saga = c.sagas.pop(ev.saga)
    _free_held_extra(s, saga)
    retry_t = ev.t + c.policy.preemption_retry_ms
    preemptor = c.jobs.get(saga.preemptor)
    if preemptor is not None and preemptor.state == RESERVED:
        _vacate(s, preemptor)
        hold_remove(s.index, preemptor)
        preemptor.state = QUEUED
        preemptor.saga = ""
        preemptor.placement = []
        preemptor.preempt_retry_t = retry_t
        queue_add(s.index, s.scratch, preemptor, s.canonical.policy.aging_levels_max)
    for victim_id in saga.victims:
        victim = c.jobs.get(victim_id)
        if victim is None:
            continue
        victim.saga = ""
        if victim.state == PREEMPTING:
            victim.progress_ms = job_progress_ms(victim, ev.t)
            victim.run_started_t = ev.t
            victim.frozen_t = 0
            victim.state = RUNNING
            victim.cascade_depth = 0
            victim.protected_until_t = max(victim.protected_until_t, retry_t)


def _notice_overdue(s: State, ev: T.NoticeOverdue) -> None:
    s.canonical.jobs[ev.job].overdue_saga = ev.saga


def _declined(s: State, ev: T.PreemptionDeclined) -> None:
    s.canonical.jobs[ev.job].last_decline = ev.reason


def _team_protected(s: State, ev: T.TeamProtected) -> None:
    s.canonical.team_protected_until[ev.team] = ev.until_t


def _team_downgraded(s: State, ev: T.TeamDowngraded) -> None:
    s.canonical.team_downgraded_until[ev.team] = ev.until_t


def _level_restored(s: State, ev: T.JobLevelRestored) -> None:
    job = s.canonical.jobs[ev.job]
    queue_remove(s.index, s.scratch, job)
    job.level = ev.level
    job.eff_level = min(job.eff_level, ev.level)
    job.level_since_t = ev.t
    queue_add(s.index, s.scratch, job, s.canonical.policy.aging_levels_max)


def _compensation(s: State, ev: T.CompensationGranted) -> None:
    entry = s.canonical.ledger.get(ev.team) or Ledger()
    if ev.kind == "quota_gpu_hours" and ev.until_t:
        # A time-limited bonus: the newest grant's end holds for the sum (older logs: for good).
        if entry.quota_bonus_until_t <= ev.t:
            entry.quota_bonus_gpu_hours = 0.0
        entry.quota_bonus_gpu_hours += ev.amount
        entry.quota_bonus_until_t = max(entry.quota_bonus_until_t, ev.until_t)
    elif ev.kind == "quota_gpu_hours":
        entry.quota_gpu_hours += ev.amount
    elif ev.kind == "fee_credit":
        entry.fee_credit += ev.amount
    else:
        entry.priority_boosts += int(ev.amount)
    s.canonical.ledger[ev.team] = entry
    job = s.canonical.jobs.get(ev.job)
    if job is not None and ev.kind == "fee_credit":
        job.compensations += 1


SAGA_HANDLERS: dict[type, typing.Callable[[State, typing.Any], None]] = {
    T.PreemptionPlanned: _preemption_planned,
    T.VictimReleased: _victim_released,
    T.PreemptionCommitted: _preemption_committed,
    T.PreemptionRolledBack: _preemption_rolled_back,
    T.NoticeOverdue: _notice_overdue,
    T.PreemptionDeclined: _declined,
    T.TeamProtected: _team_protected,
    T.TeamDowngraded: _team_downgraded,
    T.JobLevelRestored: _level_restored,
    T.CompensationGranted: _compensation,
}
