"""The rows the everyday commands print, built from a folded state or the log's records:
open jobs with why they wait (core/explain.py), queues per level, nodes (sinfo-like),
team shares (sshare-like) and finished jobs' history (sacct-like). Pure functions: the
command line fetches, calls one of these, and prints; the dashboard serves the same rows."""

from __future__ import annotations

from core import types as T
from core.explain import explain_queue, human_duration
from core.passes.placement import reserved_nodes
from core.model.entities import HELD, HOLDING, QUEUED, job_progress_ms, last_checkpoint

__all__ = [
    "job_rows",
    "queue_levels",
    "node_rows",
    "share_rows",
    "history_rows",
    "placement_rows",
    "prio_row",
    "usage_rows",
    "keep",
    "human_duration",
]


def job_rows(state, now_ms: int | None = None) -> list[dict]:
    """Every open job: where it runs and how far it got, or why it waits and when it is
    expected to start. Progress and waits run to `now_ms` (the log's time when not given:
    a quiet log's last event may be minutes old)."""
    reasons = explain_queue(state)
    rows = []
    c = state.canonical
    now = max(c.t, now_ms or 0)
    for job_id in sorted(c.jobs):
        job = c.jobs[job_id]
        ckpt = last_checkpoint(job)
        row = {
            "job": job.id,
            "team": job.team,
            "user": job.user,
            "level": job.level,
            "eff_level": job.eff_level,
            "state": job.state,
            "gpus": job.gpus,
            "gpu_models": list(job.gpu_models),
            "placement": [f"{s.node}:{','.join(map(str, s.gpus))}" for s in job.placement],
            "progress_s": round(job_progress_ms(job, now) / 1000, 1),
            "preempt_count": job.preempt_count,
            "checkpoint_step": ckpt.step if ckpt else None,
            "saga": job.saga,
            "wait_s": None,
            "reason_code": "",
            "reason": "",
            "start_in_s": None,
        }
        if job.state in (QUEUED, HELD) or job_id in reasons:
            row["wait_s"] = round(max(0, now - job.queued_since_t) / 1000, 1)
        why = reasons.get(job_id)
        if why is not None:
            row.update(
                reason_code=why.code,
                reason=why.reason,
                limit=why.limit,
                start_in_s=None if why.start_in_ms is None else round(why.start_in_ms / 1000, 1),
            )
        rows.append(row)
    return rows


def queue_levels(state, rows: list[dict] | None = None) -> list[dict]:
    """Per level, its queue policy, the queued jobs in serving order with their reasons,
    and the jobs holding GPUs there."""
    from core.passes.queues import queue_order

    c = state.canonical
    by_job = {r["job"]: r for r in (rows if rows is not None else job_rows(state))}
    levels = []
    for level in range(T.LEVELS):
        order = queue_order(state, level, 10_000)
        running = [j for j in sorted(c.jobs) if c.jobs[j].state in HOLDING and c.jobs[j].eff_level == level]
        held = sorted(
            (j for j in c.jobs if c.jobs[j].state == HELD and c.jobs[j].eff_level == level),
            key=lambda j: (c.jobs[j].submit_t, j),
        )
        levels.append(
            {
                "level": level,
                "policy": c.policy.queue_policy[level],
                "queued": [
                    {
                        key: by_job[j][key]
                        for key in (
                            "job",
                            "team",
                            "user",
                            "gpus",
                            "wait_s",
                            "reason_code",
                            "reason",
                            "start_in_s",
                        )
                    }
                    for j in order
                    if j in by_job
                ],
                "holding": [
                    {
                        "job": j,
                        "team": c.jobs[j].team,
                        "user": c.jobs[j].user,
                        "state": c.jobs[j].state,
                        "gpus": c.jobs[j].gpus,
                    }
                    for j in running
                ],
                # Held jobs keep their place by submit time but are not served (Slurm shows
                # them with their reason too).
                "held": [
                    {
                        key: by_job[j][key]
                        for key in ("job", "team", "user", "gpus", "wait_s", "reason_code", "reason")
                    }
                    for j in held
                    if j in by_job
                ],
            }
        )
    return levels


def node_rows(state) -> list[dict]:
    """Each node: model, GPUs free and used, its jobs, up or down (Slurm's sinfo)."""
    c = state.canonical
    rows = []
    for name in sorted(c.nodes):
        node = c.nodes[name]
        jobs = sorted(dict.fromkeys(h for h in node.holder if h))
        used = sum(1 for h in node.holder if h)
        rows.append(
            {
                "node": name,
                "gpu_model": node.gpu_model,
                "gpus": node.gpus,
                "used": used,
                "free": node.gpus - used if node.up else 0,
                "jobs": jobs,
                "state": _node_state(node, used, reserved_nodes(state)),
                "cordoned_by": node.cordoned_by,
                "cordon_reason": node.cordon_reason,
            }
        )
    return rows


def _node_state(node, used: int, reserved: dict) -> str:
    if not node.up:
        return "down"
    if node.cordoned_by:
        return "cordoned"  # Slurm's drained / draining: no new work, running jobs go on
    if node.name in reserved:
        return "reserved"
    return "idle" if used == 0 else "allocated" if used == node.gpus else "mixed"


def share_rows(state) -> list[dict]:
    """Each team with demand or a ledger: quota, fair share, GPUs held and asked for,
    whether it is protected or downgraded and until when, compensation (Slurm's sshare)."""
    from core.rules.fairness import team_downgrade_ends_t
    from core.model.policy import FAIR_SHARE
    from core.rules.shares import fair_shares, holding, team_quota

    c = state.canonical
    ix = state.index
    p = c.policy
    shares = fair_shares(state)
    fair_levels = [level for level, name in enumerate(p.queue_policy) if name == FAIR_SHARE]
    held = holding(state)
    used = [key.split("/", 1)[1] for key in c.usage]  # teams that ran lately (with a half-life)
    teams = sorted(
        dict.fromkeys([*shares, *c.ledger, *c.team_protected_until, *c.team_downgraded_until, *used])
    )
    rows = []
    for team in teams:
        ledger = c.ledger.get(team)
        win = c.team_windows.get(team)
        rows.append(
            {
                "team": team,
                "quota": round(team_quota(state, team), 3),
                "fair_share_gpus": round(shares.get(team, 0.0), 2),
                "held_gpus": held.get(team, 0),
                "queued_gpus": ix.team_queued_gpus.get(team, 0),
                "usage": round(held.get(team, 0) / shares[team], 3) if shares.get(team) else None,
                "protected_for_s": _left_s(c.team_protected_until.get(team, 0), c.t),
                # The core re-reads the quota on every pass: the downgrade may end before
                # the time TeamDowngraded announced.
                "downgraded_for_s": _left_s(team_downgrade_ends_t(state, team), c.t),
                "preempted_in_window": _count(win, "preempted", c.t, c.policy.fairness_window_ms),
                "preempting_in_window": _count(win, "preempting", c.t, c.policy.fairness_window_ms),
                "quota_gpu_hours": round(ledger.quota_gpu_hours, 3) if ledger else 0.0,
                "fee_credit": round(ledger.fee_credit, 3) if ledger else 0.0,
                "priority_boosts": ledger.priority_boosts if ledger else 0,
                # Inside each fair-share level: the GPUs held there on average lately (with
                # fair_share_half_life_s), and the standing the queue serves it by (lowest first).
                "levels": {
                    str(level): _level_standing(state, level, team)
                    for level in fair_levels
                    if ix.level_team_gpus[level].get(team) or c.usage.get(f"{level}/{team}")
                },
            }
        )
    return rows


def _level_standing(state, level: int, team: str) -> dict:
    """A team inside one fair-share level: GPUs held there now and on average lately, and
    the standing the level's queue serves it by (`level_share_used`, lowest first)."""
    from core.rules.shares import level_share_used, level_used_gpus, team_quota

    p = state.canonical.policy

    held = state.index.level_team_gpus[level].get(team, 0)
    lately = level_used_gpus(state, level, team)
    standing, why = level_share_used(p, held, lately, team_quota(state, team))
    return {
        "held_gpus": held,
        "used_gpus_lately": round(lately, 6),
        "standing": round(standing, 3),
        "by": why,
    }


def _left_s(until_t: int, t: int) -> float | None:
    return round((until_t - t) / 1000, 1) if until_t > t else None


def _count(win, field: str, t: int, window_ms: int) -> int:
    from core.model.entities import window_count

    return window_count(getattr(win, field), t, window_ms) if win is not None else 0


def history_rows(records, now_t: int | None = None) -> list[dict]:
    """One row per job the log has seen, finished or not (Slurm's sacct): state, wait (every
    stretch queued, the current one up to the log's last time), run time (every run, the
    current one too), preemptions, lost progress, compensation, and the exit code when the
    host gave one."""
    jobs: dict[str, dict] = {}
    queued_since: dict[str, int] = {}
    running_since: dict[str, int] = {}
    last_t = 0
    for record in records:
        ev = record.event
        last_t = max(last_t, ev.t)
        job_id = getattr(ev, "job", "")
        if isinstance(ev, T.JobSubmitted):
            jobs[job_id] = {
                "job": job_id,
                "team": ev.team,
                "user": ev.user,
                "level": ev.level,
                "requested_level": ev.requested_level,
                "gpus": ev.gpus,
                "state": "queued",
                "submit_t": ev.t,
                "start_t": None,
                "end_t": None,
                "wait_s": 0.0,
                "run_s": 0.0,
                "preemptions": 0,
                "lost_progress_s": 0.0,
                "compensation": {},
                "exit_code": None,
                "reason": "",
            }
            queued_since[job_id] = ev.t
            continue
        row = jobs.get(job_id)
        if row is None:
            continue
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
            row["state"] = "starting"
        elif isinstance(ev, T.JobRunning):
            row["state"] = "running"
            row["wait_s"] += (ev.t - queued_since.pop(job_id, ev.t)) / 1000
            running_since[job_id] = ev.t
            row["start_t"] = row["start_t"] or ev.t
        elif isinstance(ev, T.JobRequeued):
            row["state"] = "queued"
            row["preemptions"] = ev.preempt_count
            row["lost_progress_s"] += ev.lost_progress_ms / 1000
            row["run_s"] += (ev.t - running_since.pop(job_id, ev.t)) / 1000
            queued_since[job_id] = ev.t
        elif isinstance(ev, (T.JobHeld, T.JobHoldReleased)):
            row["state"] = "held" if isinstance(ev, T.JobHeld) else "queued"
        elif isinstance(ev, T.CheckpointFallback):
            row["lost_progress_s"] += ev.lost_progress_ms / 1000
        elif isinstance(ev, T.CompensationGranted):
            row["compensation"][ev.kind] = round(row["compensation"].get(ev.kind, 0.0) + ev.amount, 3)
        elif isinstance(ev, (T.JobFinished, T.JobFailed, T.JobCancelled)):
            row["state"] = {T.JobFinished: "finished", T.JobFailed: "failed", T.JobCancelled: "cancelled"}[
                type(ev)
            ]
            row["end_t"] = ev.t
            row["run_s"] += (ev.t - running_since.pop(job_id, ev.t)) / 1000
            row["wait_s"] += (ev.t - queued_since.pop(job_id, ev.t)) / 1000  # cancelled while queued
            row["reason"] = getattr(ev, "reason", "")
            row["exit_code"] = _exit_code(ev)
    now = max(last_t, now_t or 0)
    for job_id, since in running_since.items():
        jobs[job_id]["run_s"] += (now - since) / 1000
    for job_id, since in queued_since.items():
        jobs[job_id]["wait_s"] += (now - since) / 1000
    return [jobs[j] for j in sorted(jobs, key=lambda j: (jobs[j]["submit_t"], j))]


def placement_rows(records, node: str | None = None, since_t: int | None = None, until_t: int | None = None):
    """What ran where and when (Slurm's `sacct -N`): the projection's `placements` rows, from
    these records, of `node` (every node if None) that held it at some time between `since_t`
    and `until_t` (open ends when None); oldest first."""
    import duckdb

    from .projector import Projector

    projector = Projector(duckdb.connect())
    projector.apply((i, T.encode_record(record)) for i, record in enumerate(records, 1))
    cur = projector.con.execute(
        """
        SELECT * FROM placements
        WHERE ($1::VARCHAR IS NULL OR node = $1)
          AND ($2::BIGINT IS NULL OR end_t IS NULL OR end_t >= $2)
          AND ($3::BIGINT IS NULL OR requested_t <= $3)
        ORDER BY requested_t, job, node""",
        [node, since_t, until_t],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _exit_code(ev) -> int | None:
    """0 for a finished job; a failed job's status from its reason (`exit_code_N`)."""
    if isinstance(ev, T.JobFinished):
        return 0
    reason = getattr(ev, "reason", "")
    if reason.startswith("exit_code_"):
        try:
            return int(reason.removeprefix("exit_code_"))
        except ValueError:
            return None
    return None


def keep(
    rows: list[dict],
    team: str | None = None,
    user: str | None = None,
    level: int | None = None,
    state: str | None = None,
    since_t: int | None = None,
    until_t: int | None = None,
) -> list[dict]:
    """The rows that match every filter given (state may list several, comma separated)."""
    states = set(state.split(",")) if state else None
    out = []
    for row in rows:
        t = row.get("submit_t")
        if (
            (team and row.get("team") != team)
            or (user and row.get("user") != user)
            or (level is not None and row.get("level") != level)
            or (states and row.get("state") not in states)
            or (since_t is not None and t is not None and t < since_t)
            or (until_t is not None and t is not None and t > until_t)
        ):
            continue
        out.append(row)
    return out


def prio_row(state, job_id: str, now_ms: int | None = None) -> dict | None:
    """Each factor of a waiting job's place (Slurm's sprio), or None when the job is not
    open: its level and the level it queues at (what a recovery boost and aging added), when
    it ages next, its level's queue policy and its position there (jobs and GPUs ahead), its
    team's fair-share standing at that level, the holds (reservations) in force - its own
    and those for others - and why it waits, with the expected start."""
    from core.passes.queues import aging_threshold_ms, queue_order
    from core.rules.shares import level_share_used, level_used_gpus, team_quota

    c = state.canonical
    job = c.jobs.get(job_id)
    if job is None:
        return None
    now = max(c.t, now_ms or 0)
    p = c.policy
    boosted = min(job.boost, job.level)
    aged = max(0, job.level - boosted - job.eff_level)
    waiting = job.state in ("queued", "held", "reserved")
    order = queue_order(state, job.eff_level, 100_000) if job.state == QUEUED else []
    ahead = order[: order.index(job_id)] if job_id in order else []
    ages = job.state == QUEUED and job.eff_level > 0 and job.level - job.eff_level < p.aging_levels_max
    next_aging_s = None
    if ages:
        threshold = aging_threshold_ms(state, job.eff_level)
        next_aging_s = round(max(0, threshold - (now - job.level_since_t)) / 1000, 1)
    quota = team_quota(state, job.team)
    held_at_level = state.index.level_team_gpus[job.level].get(job.team, 0)
    used_lately = level_used_gpus(state, job.level, job.team)
    standing, _ = level_share_used(p, held_at_level, used_lately, quota)
    holds = reserved_nodes(state)
    why = explain_queue(state, [job_id]).get(job_id) if waiting else None
    return {
        "job": job.id,
        "team": job.team,
        "user": job.user,
        "state": job.state,
        "gpus": job.gpus,
        "level": job.level,
        "requested_level": job.requested_level,
        "queue_level": job.eff_level,
        "levels_from_boost": boosted,
        "levels_from_aging": aged,
        "next_aging_in_s": next_aging_s,
        "aging_levels_max": p.aging_levels_max,
        "queue_policy": p.queue_policy[job.eff_level],
        "position": len(ahead) + 1 if job_id in order else None,
        "queued_at_level": len(order),
        "jobs_ahead": len(ahead),
        "gpus_ahead": sum(c.jobs[j].gpus for j in ahead),
        "submit_t": job.submit_t,
        "wait_s": round(max(0, now - job.queued_since_t) / 1000, 1) if waiting else None,
        "team_quota": round(quota, 3),
        "team_gpus_at_level": held_at_level,
        "team_gpus_lately_at_level": round(used_lately, 6),
        "team_fair_share_ratio": round(standing, 3) if quota else None,
        "holds_own_nodes": sorted(n for n, (_, holder) in holds.items() if holder == job_id),
        "holds_for_others": sorted(
            {holder: None for _, (_, holder) in sorted(holds.items()) if holder != job_id}
        ),
        "reason_code": why.code if why else "",
        "reason": why.reason if why else "",
        "start_in_s": None if why is None or why.start_in_ms is None else round(why.start_in_ms / 1000, 1),
    }


def usage_rows(records, half_life_s: float, now_t: int) -> dict[str, dict]:
    """Per team, GPU-hours run and the same decayed by half every `half_life_s` before
    `now_t`, with its part of all decayed usage: the projection's `team_usage_decayed`
    macro over these records."""
    import duckdb

    from .projector import Projector

    projector = Projector(duckdb.connect())
    projector.apply((i, T.encode_record(record)) for i, record in enumerate(records, 1))
    cur = projector.con.execute("SELECT * FROM team_usage_decayed(?, ?)", [half_life_s, now_t])
    return {
        team: {
            "gpu_hours": round(hours, 3),
            "decayed_gpu_hours": round(decayed, 3),
            "decayed_part": None if part is None else round(part, 4),
        }
        for team, hours, decayed, part in cur.fetchall()
    }
