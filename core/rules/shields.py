"""A victim's shield: what keeps a running job from being preempted, whoever asks. A victim
must be running and in no saga (`busy`), submitted preemptible (`not_preemptible`), past its
restart protection (`min_run_after_restart_ms`; by default not against the urgent levels,
where the recovery boost prices a recently preempted victim dearer instead), and, unless
the preemptor is of its own team (user), its team (user) not protected for having been
preempted too often (`team_preempted_max`, `user_preempted_max`): the fairness limits
protect a team and a user from others, not from reordering their own work. A reclaim takes
only other teams' jobs (`own_team`).

`victim_shield` returns "" when nothing shields the victim, else the shield's name.
"""

from __future__ import annotations

from ..model.entities import RUNNING, Job, window_count
from ..model.words import human_duration
from .decision import Decision
from .fairness import scaled_limit, team_limit

BUSY = "busy"
NOT_PREEMPTIBLE = "not_preemptible"
RESTARTED = "min_run_after_restart_ms"
TEAM_PROTECTED = "team_preempted_max"
USER_PROTECTED = "user_preempted_max"
OWN_TEAM = "own_team"


def victim_shield(d: Decision, victim: Job) -> str:
    """The first shield that keeps `victim` from `d`'s preemptor, or "" when none does."""
    if victim.state != RUNNING or victim.saga:
        return BUSY
    if not victim.preemptible:
        return NOT_PREEMPTIBLE
    preemptor = d.job
    if d.reclaim and victim.team == preemptor.team:
        return OWN_TEAM
    p = d.policy
    t = d.t
    if victim.protected_until_t > t and (preemptor.level >= p.urgent_levels or p.restart_protect_from_urgent):
        return RESTARTED
    c = d.state.canonical
    if victim.team != preemptor.team and c.team_protected_until.get(victim.team, 0) > t:
        return TEAM_PROTECTED
    if victim.user == preemptor.user:
        return ""
    win = c.user_windows.get(victim.user)
    if win is not None and window_count(win.preempted, t, p.fairness_window_ms) >= scaled_limit(
        d.state, p.user_preempted_max
    ):
        return USER_PROTECTED
    return ""


def describe(d: Decision, shield: str, victims: list[Job]) -> str:
    """The sentence for a shield that keeps `victims` from `d`'s preemptor."""
    p = d.policy
    c = d.state.canonical
    t = d.t
    if shield == TEAM_PROTECTED:
        teams = sorted(dict.fromkeys(v.team for v in victims))
        first = teams[0]
        win = c.team_windows.get(first)
        count = window_count(win.preempted, t, p.fairness_window_ms) if win is not None else 0
        return (
            f"their teams ({', '.join(teams)}) were preempted {count} times in the last"
            f" {human_duration(p.fairness_window_ms)} and are protected (team_preempted_max, limit"
            f" {team_limit(d.state, first, p.team_preempted_max)}) until in"
            f" {human_duration(c.team_protected_until.get(first, t) - t)}"
        )
    if shield == USER_PROTECTED:
        users = ", ".join(sorted(dict.fromkeys(v.user for v in victims)))
        return (
            f"their users ({users}) were preempted too often (user_preempted_max, limit"
            f" {scaled_limit(d.state, p.user_preempted_max)} in {human_duration(p.fairness_window_ms)})"
        )
    if shield == RESTARTED:
        return "they restarted lately and are protected (min_run_after_restart_ms)"
    if shield == NOT_PREEMPTIBLE:
        return "they were submitted not preemptible"
    if shield == OWN_TEAM:
        return f"they are of its own team {d.job.team}: a reclaim takes back GPUs from other teams"
    return "they are starting or already in a preemption"
