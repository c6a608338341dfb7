"""Monitoring numbers read from the projection: per level, team and user, queue depth and
wait, running GPUs, preemption count and success rate, preemption wait, victim recovery
time, lost progress and compensation; a timeline of recent preemptions; and the alerts.

`snapshot(con)` returns them as one JSON-able dict (the dashboard renders it);
`prometheus(con)` writes the Prometheus text exposition format (version 0.0.4).
"Now" is the newest time in the log, so a replayed log reads like a live one.
"""

from __future__ import annotations

from typing import Any

from . import alerts

RECENT_WAIT_MS = 3_600_000  # queue waits of the last hour make the "recent wait" figure
TIMELINE_ROWS = 15


def _rows(con, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def now_t(con) -> int:
    row = con.execute("SELECT max(t) FROM events").fetchone()
    return int(row[0] or 0)


def by_group(con, group: str, now: int) -> list[dict]:
    """One row per level, team or user (group is the column name)."""
    g = {"level": "level", "team": "team", "user": '"user"'}[group]
    jobs_g = {"level": "eff_level", "team": "team", "user": '"user"'}[group]
    victim_g = {"level": "victim_level", "team": "victim_team", "user": "victim_user"}[group]
    pre_g = {"level": "preemptor_level", "team": "preemptor_team", "user": "preemptor_user"}[group]
    return _rows(con, f"""
        WITH keys AS (
            SELECT {g} AS k FROM jobs UNION SELECT {jobs_g} FROM jobs
        ), q AS (
            SELECT {jobs_g} AS k, count(*) AS queued, max(? - queued_since_t) AS oldest_wait_ms
            FROM jobs WHERE state = 'queued' GROUP BY 1
        ), r AS (
            SELECT {g} AS k, sum(gpus) AS running_gpus FROM jobs
            WHERE state IN ('starting', 'running', 'reserved', 'preempting') GROUP BY 1
        ), w AS (
            SELECT {g} AS k, avg(waited_ms) AS wait_ms_mean FROM queue_wait
            WHERE t > ? - {RECENT_WAIT_MS} GROUP BY 1
        ), v AS (
            SELECT {victim_g} AS k, count(*) AS preempted,
                   count(*) FILTER (outcome = 'committed') AS preempted_committed,
                   count(*) FILTER (outcome = 'rolled_back') AS preempted_rolled_back,
                   avg(recovery_ms) AS victim_recovery_ms_mean,
                   sum(coalesce(requeue_lost_ms, 0) * victim_gpus) / 3600000.0 AS lost_gpu_hours
            FROM preemptions GROUP BY 1
        ), s AS (
            SELECT {pre_g} AS k, count(*) AS preemptions_started,
                   count(*) FILTER (outcome = 'committed') AS preemptions_committed,
                   count(*) FILTER (outcome = 'rolled_back') AS preemptions_rolled_back,
                   avg(wait_ms) FILTER (outcome = 'committed') AS preemption_wait_ms_mean
            FROM sagas GROUP BY 1
        ), c AS (
            SELECT {g} AS k, sum(fee_credit) AS fee_credit FROM jobs GROUP BY 1
        )
        SELECT keys.k AS {g}, coalesce(queued, 0) AS queued, coalesce(oldest_wait_ms, 0) AS oldest_wait_ms,
               wait_ms_mean, coalesce(running_gpus, 0) AS running_gpus,
               coalesce(preempted, 0) AS preempted, coalesce(preempted_committed, 0) AS preempted_committed,
               coalesce(preempted_rolled_back, 0) AS preempted_rolled_back, victim_recovery_ms_mean,
               coalesce(lost_gpu_hours, 0) AS lost_gpu_hours,
               coalesce(preemptions_started, 0) AS preemptions_started,
               coalesce(preemptions_committed, 0) AS preemptions_committed,
               preemptions_committed / nullif(preemptions_committed + preemptions_rolled_back, 0)
                   AS preemption_success_rate,
               preemption_wait_ms_mean, coalesce(fee_credit, 0) AS fee_credit
        FROM keys LEFT JOIN q USING (k) LEFT JOIN r USING (k) LEFT JOIN w USING (k)
             LEFT JOIN v USING (k) LEFT JOIN s USING (k) LEFT JOIN c USING (k)
        ORDER BY 1""", [now, now])


def timeline(con, limit: int = TIMELINE_ROWS) -> list[dict]:
    return _rows(con, """
        SELECT saga, planned_t, preemptor, preemptor_team, preemptor_level, victims, benefit, cost,
               benefit - cost AS net, reason, outcome, wait_ms, rollback_reason,
               (SELECT string_agg(victim, ', ' ORDER BY victim) FROM preemptions p
                WHERE p.saga = s.saga) AS victim_jobs
        FROM sagas s ORDER BY planned_t DESC, saga DESC LIMIT ?""", [limit])


def totals(con) -> dict:
    row = _rows(con, """
        SELECT (SELECT count(*) FROM events) AS events,
               (SELECT coalesce(max(last_seq), 0) FROM projector_position) AS last_seq,
               (SELECT count(*) FROM jobs WHERE state = 'queued') AS queued,
               (SELECT coalesce(sum(gpus), 0) FROM jobs
                 WHERE state IN ('starting', 'running', 'reserved', 'preempting')) AS running_gpus,
               (SELECT coalesce(sum(gpus), 0) FROM nodes WHERE up) AS pool_gpus,
               (SELECT count(*) FROM sagas) AS preemptions,
               (SELECT count(*) FROM sagas WHERE outcome = 'committed') AS committed,
               (SELECT count(*) FROM sagas WHERE outcome = 'rolled_back') AS rolled_back,
               (SELECT coalesce(sum(amount), 0) FROM ledger WHERE kind = 'fee_credit') AS fee_credit,
               (SELECT coalesce(sum(coalesce(requeue_lost_ms, 0) * victim_gpus), 0) / 3600000.0
                  FROM preemptions) AS lost_gpu_hours,
               (SELECT count(*) FROM jobs WHERE state IN ('finished', 'failed', 'cancelled')) AS jobs_done""")
    return row[0]


def snapshot(con, now: int | None = None) -> dict:
    now = now_t(con) if now is None else now
    return {
        "now_t": now,
        "totals": totals(con),
        "levels": by_group(con, "level", now),
        "teams": by_group(con, "team", now),
        "users": by_group(con, "user", now),
        "timeline": timeline(con),
        "pending": pending(con),
        "alerts": [a.as_dict() for a in alerts.evaluate(con, now)],
    }


PENDING_SHOWN_MAX = 50


def pending(con, limit: int = PENDING_SHOWN_MAX) -> list[dict]:
    """Why the most urgent waiting jobs wait (the `pending` table), in serving order."""
    cur = con.execute('SELECT job, team, "user", level, eff_level, gpus, state, wait_ms, code, reason,'
                      ' "limit", start_in_ms FROM pending ORDER BY eff_level, wait_ms DESC, job LIMIT ?',
                      [limit])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


# ---------------------------------------------------------------- Prometheus

_GAUGES = [
    # (metric, help, row field, scale)
    ("xirang_queue_depth", "Jobs waiting in the queue", "queued", 1),
    ("xirang_queue_oldest_wait_seconds", "Longest current wait in the queue", "oldest_wait_ms", 1e-3),
    ("xirang_queue_wait_seconds_mean", "Mean wait of jobs started in the last hour", "wait_ms_mean", 1e-3),
    ("xirang_running_gpus", "GPUs held by running, starting or reserved jobs", "running_gpus", 1),
    ("xirang_preempted_total", "Times jobs were chosen as preemption victims", "preempted", 1),
    ("xirang_preemptions_total", "Preemptions started (by the preemptor's group)", "preemptions_started", 1),
    ("xirang_preemption_success_ratio", "Committed over ended preemptions", "preemption_success_rate", 1),
    ("xirang_preemption_wait_seconds_mean", "Planned to committed, mean", "preemption_wait_ms_mean", 1e-3),
    ("xirang_victim_recovery_seconds_mean", "Notice to running again, mean", "victim_recovery_ms_mean", 1e-3),
    ("xirang_lost_progress_gpu_hours_total", "Progress lost by victims, GPU-hours", "lost_gpu_hours", 1),
    ("xirang_compensation_fee_credit_total", "Fee credit granted", "fee_credit", 1),
]


def _esc(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(con) -> str:
    now = now_t(con)
    groups = {g: by_group(con, g, now) for g in ("level", "team", "user")}
    lines: list[str] = []
    for metric, help_text, field, scale in _GAUGES:
        kind = "counter" if metric.endswith("_total") else "gauge"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for group, rows in groups.items():
            for row in rows:
                value = row[field]
                if value is None:
                    continue
                lines.append(f'{metric}{{{group}="{_esc(row[group])}"}} {float(value) * scale:.6g}')
    fired = alerts.evaluate(con, now)
    lines += ["# HELP xirang_alert_firing Alerts firing now (1 per alert)",
              "# TYPE xirang_alert_firing gauge"]
    for alert in fired:
        lines.append(f'xirang_alert_firing{{kind="{alert.kind}",subject="{_esc(alert.subject)}"}} 1')
    t = totals(con)
    lines += ["# HELP xirang_projected_events_total Records in the projection",
              "# TYPE xirang_projected_events_total counter", f"xirang_projected_events_total {t['events']}",
              "# HELP xirang_projector_last_seq Stream sequence of the last projected record",
              "# TYPE xirang_projector_last_seq gauge", f"xirang_projector_last_seq {t['last_seq']}",
              "# HELP xirang_log_time_seconds Newest log time", "# TYPE xirang_log_time_seconds gauge",
              f"xirang_log_time_seconds {now / 1000:.3f}"]
    return "\n".join(lines) + "\n"
