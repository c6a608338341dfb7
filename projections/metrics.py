"""Monitoring numbers read from the projection: per level, team and user, queue depth and
wait, running GPUs, preemption count and success rate, preemption wait, victim recovery
time, lost progress and compensation; a timeline of recent preemptions; and the alerts.

`snapshot(con)` returns them as one JSON-able dict (the dashboard renders it);
`prometheus(con)` writes the Prometheus text exposition format through prometheus_client (a
custom collector over the projection; per level and team, never per job or user).
"Now" is the newest time in the log, so a replayed log reads like a live one.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from . import alerts

RECENT_WAIT_MS = 3_600_000  # queue waits of the last hour make the "recent wait" figure
TIMELINE_ROWS = 15


def _rows(con, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def now_t(con) -> int:
    """The newest event time in the projection (0 when empty)."""
    row = con.execute("SELECT max(t) FROM events").fetchone()
    return int(row[0] or 0)


def by_group(con, group: str, now: int) -> list[dict]:
    """One row per level, team or user (group is the column name)."""
    g = {"level": "level", "team": "team", "user": '"user"'}[group]
    jobs_g = {"level": "eff_level", "team": "team", "user": '"user"'}[group]
    victim_g = {"level": "victim_level", "team": "victim_team", "user": "victim_user"}[group]
    pre_g = {"level": "preemptor_level", "team": "preemptor_team", "user": "preemptor_user"}[group]
    return _rows(
        con,
        f"""
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
                   count(*) FILTER (outcome IN ('committed', 'released_late')) AS preempted_committed,
                   count(*) FILTER (outcome = 'rolled_back') AS preempted_rolled_back,
                   avg(recovery_ms) AS victim_recovery_ms_mean,
                   sum(coalesce(requeue_lost_ms, 0) * victim_gpus) / 3600000.0 AS lost_gpu_hours
            FROM preemptions GROUP BY 1
        ), s AS (
            SELECT {pre_g} AS k, count(*) AS preemptions_started,
                   count(*) FILTER (outcome IN ('committed', 'released_late')) AS preemptions_committed,
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
        ORDER BY 1""",
        [now, now],
    )


def timeline(con, limit: int = TIMELINE_ROWS) -> list[dict]:
    """The newest preemption sagas, with their victims and outcome."""
    return _rows(
        con,
        """
        SELECT saga, planned_t, preemptor, preemptor_team, preemptor_level, victims, benefit, cost,
               benefit - cost AS net, reason, outcome, wait_ms, rollback_reason,
               (SELECT string_agg(victim, ', ' ORDER BY victim) FROM preemptions p
                WHERE p.saga = s.saga) AS victim_jobs
        FROM sagas s ORDER BY planned_t DESC, saga DESC LIMIT ?""",
        [limit],
    )


def totals(con) -> dict:
    """The headline numbers: events, position, queue, GPUs in use and in the pool, preemption
    outcomes."""
    row = _rows(
        con,
        """
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
               (SELECT count(*) FROM jobs WHERE state IN ('finished', 'failed', 'cancelled')) AS jobs_done""",
    )
    return row[0]


def snapshot(con, now: int | None = None) -> dict:
    """Everything the dashboard shows, as plain data, as of `now` (the projection's newest time
    by default)."""
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
        "satisfaction": satisfaction(con),
    }


PENDING_SHOWN_MAX = 50


def pending(con, limit: int = PENDING_SHOWN_MAX) -> list[dict]:
    """Why the most urgent waiting jobs wait (the `pending` table), in serving order."""
    cur = con.execute(
        'SELECT job, team, "user", level, eff_level, gpus, state, wait_ms, code, reason,'
        ' "limit", start_in_ms FROM pending ORDER BY eff_level, wait_ms DESC, job LIMIT ?',
        [limit],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def satisfaction(con) -> list[dict]:
    """Survey answers (`xirang feedback`) per team and level of the jobs they are about."""
    cur = con.execute("SELECT team, level, answers, score_mean, unhappy FROM satisfaction")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


# ---------------------------------------------------------------- Prometheus
#
# Conventions (prometheus.io/docs/practices/naming): every name starts with `xirang_`, is in
# base units (seconds, GPUs), counters end in `_total`, and each grouping has a family of its
# own (`xirang_level_*`, `xirang_team_*`), so summing one family never counts a job twice.
# Waits are histograms. No label carries a job or user id: their number is unbounded (every
# new value is a new series for Prometheus to keep), and a user's own numbers are in
# `snapshot` and the SQL views. The text is written by prometheus_client from a collector
# that reads the projection when scraped.

# (name after the grouping's prefix, help, row field, scale, type)
_GROUP_SERIES = [
    ("queue_jobs", "Jobs waiting in the queue", "queued", 1, "gauge"),
    ("queue_oldest_wait_seconds", "Longest current wait in the queue", "oldest_wait_ms", 1e-3, "gauge"),
    (
        "running_gpus",
        "GPUs held by starting, running, reserved or preempting jobs",
        "running_gpus",
        1,
        "gauge",
    ),
    ("preempted_total", "Times jobs were chosen as preemption victims", "preempted", 1, "counter"),
    ("preemptions_total", "Preemptions started by the group's jobs", "preemptions_started", 1, "counter"),
    (
        "preemptions_committed_total",
        "Preemptions by the group's jobs that committed",
        "preemptions_committed",
        1,
        "counter",
    ),
    (
        "lost_progress_gpu_seconds_total",
        "Progress victims of the group lost, in GPU-seconds",
        "lost_gpu_hours",
        3600,
        "counter",
    ),
    ("compensation_fee_credit_total", "Fee credit granted to the group's jobs", "fee_credit", 1, "counter"),
]
# The groupings exported (users are not: see above).
_GROUPS = ("level", "team")
# Upper bounds of the wait histograms, in seconds: from a second to a day.
WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
# The content type of `prometheus`'s text, for the HTTP answer.
PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST


def _family(name: str, help_text: str, kind: str, labels: list[str] | None = None):
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


def _histogram(name: str, help_text: str, label: str, rows: list[tuple]) -> HistogramMetricFamily:
    """rows: (label value, [observations in ms]) -> a cumulative histogram per label value."""
    family = HistogramMetricFamily(name, help_text, labels=[label] if label else None)
    for key, observations in rows:
        seconds = sorted(v / 1000 for v in observations)
        buckets, i = [], 0
        for bound in WAIT_BUCKETS_S:
            while i < len(seconds) and seconds[i] <= bound:
                i += 1
            buckets.append((str(bound), i))
        buckets.append(("+Inf", len(seconds)))
        family.add_metric([str(key)] if label else [], buckets, sum(seconds))
    return family


def _grouped(con, column: str) -> list[tuple]:
    rows = con.execute(f"SELECT {column}, list(waited_ms) FROM queue_wait GROUP BY 1 ORDER BY 1").fetchall()
    return [(key, values) for key, values in rows]


def alert_scope(alert: alerts.Alert) -> str:
    """An alert's subject as a bounded label: a level, a team or the scheduler as it is; a
    job's alerts counted together as `jobs`."""
    return "jobs" if alert.subject.startswith("job ") else alert.subject


class ProjectionCollector:
    """A prometheus_client collector over one projection connection: reads the numbers when
    scraped (`collect`), so /metrics always shows the projection as it is."""

    def __init__(self, con, input_backlog: int | None = None) -> None:
        self.con = con
        self.input_backlog = input_backlog

    def collect(self):
        """Every `xirang_` family, read from the projection now."""
        con = self.con
        now = now_t(con)
        for group in _GROUPS:
            rows = by_group(con, group, now)
            for suffix, help_text, field, scale, kind in _GROUP_SERIES:
                family = _family(f"xirang_{group}_{suffix}", f"{help_text}, per {group}", kind, [group])
                for row in rows:
                    if row[field] is not None:
                        family.add_metric([str(row[group])], float(row[field]) * scale)
                yield family
        yield _histogram(
            "xirang_level_queue_wait_seconds",
            "Time each start waited in the queue, per level",
            "level",
            _grouped(con, "level"),
        )
        yield _histogram(
            "xirang_team_queue_wait_seconds",
            "Time each start waited in the queue, per team",
            "team",
            _grouped(con, "team"),
        )
        sagas = con.execute(
            "SELECT wait_ms FROM sagas WHERE outcome = 'committed' AND wait_ms IS NOT NULL"
        ).fetchall()
        yield _histogram(
            "xirang_preemption_duration_seconds",
            "Planned to committed, per committed preemption",
            "",
            [("", [w for (w,) in sagas])] if sagas else [],
        )
        recovery = con.execute("SELECT recovery_ms FROM preemptions WHERE recovery_ms IS NOT NULL").fetchall()
        yield _histogram(
            "xirang_victim_recovery_seconds",
            "Notice to running again, per preempted job",
            "",
            [("", [r for (r,) in recovery])] if recovery else [],
        )
        t = totals(con)
        nodes = con.execute(
            "SELECT count(*) FILTER (up), count(*) FILTER (NOT up), count(*) FILTER (lost_t IS NOT NULL),"
            " count(*) FILTER (up AND coalesce(cordoned_by, '') <> '') FROM nodes"
        ).fetchone()
        for name, help_text, kind, value in (
            ("xirang_preemptions_total", "Preemptions started", "counter", t["preemptions"]),
            ("xirang_preemptions_committed_total", "Preemptions committed", "counter", t["committed"]),
            ("xirang_preemptions_rolled_back_total", "Preemptions rolled back", "counter", t["rolled_back"]),
            ("xirang_queue_jobs", "Jobs waiting in the queue", "gauge", t["queued"]),
            ("xirang_running_gpus", "GPUs held by jobs", "gauge", t["running_gpus"]),
            ("xirang_pool_gpus", "GPUs of the nodes up", "gauge", t["pool_gpus"]),
            ("xirang_nodes_up", "Nodes up", "gauge", nodes[0]),
            ("xirang_nodes_down", "Nodes lost and not back", "gauge", nodes[1]),
            ("xirang_nodes_cordoned", "Nodes up that take no new work (cordoned)", "gauge", nodes[3]),
            ("xirang_jobs_done_total", "Jobs finished, failed or cancelled", "counter", t["jobs_done"]),
            ("xirang_projected_events_total", "Records in the projection", "counter", t["events"]),
            (
                "xirang_projector_last_seq",
                "Stream sequence of the last projected record",
                "gauge",
                t["last_seq"],
            ),
            ("xirang_log_time_seconds", "Newest log time (Unix seconds)", "gauge", now / 1000),
        ):
            family = _family(name, help_text, kind)
            family.add_metric([], float(value))
            yield family
        if self.input_backlog is not None:
            family = _family("xirang_input_backlog", "Inputs on XR_IN the log has not answered yet", "gauge")
            family.add_metric([], float(self.input_backlog))
            yield family
        firing: dict[tuple[str, str], int] = {}
        for alert in alerts.evaluate(con, now):
            key = (alert.kind, alert_scope(alert))
            firing[key] = firing.get(key, 0) + 1
        family = _family(
            "xirang_alert_firing",
            "Alerts firing now, by kind and subject (a level, a team, the scheduler, or jobs: how many)",
            "gauge",
            ["kind", "subject"],
        )
        for (kind, subject), count in sorted(firing.items()):
            family.add_metric([kind, subject], float(count))
        yield family


def prometheus(con, input_backlog: int | None = None) -> str:
    """The projection's numbers in the Prometheus text format (`xirang_` series), written by
    prometheus_client."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProjectionCollector(con, input_backlog))
    return generate_latest(registry).decode("utf-8")
