"""The rows the everyday commands print, built from a folded state or the log's records:
open jobs with why they wait (core/explain.py), queues per level, nodes (sinfo-like),
team shares (sshare-like) and finished jobs' history (sacct-like). Pure functions: the
command line fetches, calls one of these, and prints; the dashboard serves the same rows."""

from __future__ import annotations

from core import types as T
from core.explain import explain_queue, human_duration
from core.passes.placement import reserved_nodes
from core.model.entities import HOLDING, QUEUED, job_progress_ms, last_checkpoint

__all__ = ["job_rows", "queue_levels", "node_rows", "share_rows", "history_rows", "keep", "human_duration"]


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
        if job.state == QUEUED or job_id in reasons:
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
            }
        )
    return rows


def _node_state(node, used: int, reserved: dict) -> str:
    if not node.up:
        return "down"
    if node.name in reserved:
        return "reserved"
    return "idle" if used == 0 else "allocated" if used == node.gpus else "mixed"


def share_rows(state) -> list[dict]:
    """Each team with demand or a ledger: quota, fair share, GPUs held and asked for,
    whether it is protected or downgraded and until when, compensation (Slurm's sshare)."""
    from core.rules.fairness import team_downgrade_ends_t
    from core.rules.shares import fair_shares, holding, team_quota

    c = state.canonical
    ix = state.index
    shares = fair_shares(state)
    held = holding(state)
    teams = sorted(dict.fromkeys([*shares, *c.ledger, *c.team_protected_until, *c.team_downgraded_until]))
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
            }
        )
    return rows


def _left_s(until_t: int, t: int) -> float | None:
    return round((until_t - t) / 1000, 1) if until_t > t else None


def _count(win, field: str, t: int, window_ms: int) -> int:
    from core.model.entities import window_count

    return window_count(getattr(win, field), t, window_ms) if win is not None else 0


def history_rows(records) -> list[dict]:
    """One row per job the log has seen, finished or not (Slurm's sacct): state, wait, run
    time, preemptions, lost progress, compensation, and the exit code when the host gave one."""
    jobs: dict[str, dict] = {}
    for record in records:
        ev = record.event
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
            continue
        row = jobs.get(job_id)
        if row is None:
            continue
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
            row["state"] = "starting"
        elif isinstance(ev, T.JobRunning):
            row["state"] = "running"
            row["wait_s"] += ev.waited_ms / 1000
            row["start_t"] = row["start_t"] or ev.t
        elif isinstance(ev, T.JobRequeued):
            row["state"] = "queued"
            row["preemptions"] = ev.preempt_count
            row["lost_progress_s"] += ev.lost_progress_ms / 1000
        elif isinstance(ev, T.CheckpointFallback):
            row["lost_progress_s"] += ev.lost_progress_ms / 1000
        elif isinstance(ev, T.CompensationGranted):
            row["compensation"][ev.kind] = round(row["compensation"].get(ev.kind, 0.0) + ev.amount, 3)
        elif isinstance(ev, (T.JobFinished, T.JobFailed, T.JobCancelled)):
            row["state"] = {T.JobFinished: "finished", T.JobFailed: "failed", T.JobCancelled: "cancelled"}[
                type(ev)
            ]
            row["end_t"] = ev.t
            row["run_s"] = getattr(ev, "run_ms", 0) / 1000
            row["reason"] = getattr(ev, "reason", "")
            row["exit_code"] = _exit_code(ev)
    return [jobs[j] for j in sorted(jobs, key=lambda j: (jobs[j]["submit_t"], j))]


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
