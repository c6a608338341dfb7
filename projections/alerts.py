"""Alerts on the projection.

- `preemption_rate`: a level's preemption count in the latest window departs from its
  recent history: count >= max(min_count, mean + k * max(std, std_floor)) over the
  preceding `history_windows` windows. Counted twice, by the preemptor's level (a storm
  of urgent jobs) and by the victims' level (one level bearing the brunt). A level with no
  history is judged against zero, so a sudden storm on a quiet level fires too.
- `team_protected` / `team_downgraded`: a team hit its preemption limits (preempted too
  often, so it is protected; or preempting too often, so its new urgent jobs are
  downgraded) and the measure is still in force.
- `downgraded_waiting`: a job that entered below its requested level (its team was
  downgraded) is still queued: it waits at the lower level until the team's quota
  recovers, and someone may want to know.

Windows are in log time, ending at "now" (the newest record), so the same log always gives
the same alerts.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RateRule:
    """When a preemption rate is anomalous: its count in the last window is over the history's
    mean plus k standard deviations (with a floor) and at least `min_count`."""

    window_ms: int = 15 * 60_000
    history_windows: int = 12
    k: float = 3.0
    std_floor: float = 1.0
    min_count: int = 4


@dataclass(frozen=True)
class Alert:
    """One alert: what kind, about whom, in words, with the value and the threshold it crossed."""

    kind: str
    subject: str  # "level 6" or "team lm"
    message: str
    value: float
    threshold: float

    def as_dict(self) -> dict:
        """The alert as JSON-ready data."""
        return asdict(self)


def evaluate(con, now: int, rule: RateRule = RateRule()) -> list[Alert]:
    """Every alert that holds at `now`: anomalous preemption rates, team limits in force,
    downgraded jobs waiting, recent internal errors."""
    return (
        rate_alerts(con, now, rule)
        + team_limit_alerts(con, now)
        + downgraded_waiting_alerts(con, now)
        + internal_error_alerts(con, now)
    )


# How long an input the scheduler could not step (`internal_error`) keeps its alert up.
INTERNAL_ERROR_WINDOW_MS = 24 * 3600 * 1000


def internal_error_alerts(con, now: int) -> list[Alert]:
    """Inputs that made `step` raise: the scheduler rejected them and went on, but each is
    a bug to report, with the input's sequence and the exception's words."""
    rows = con.execute(
        """
        SELECT count(*), max(input_seq), arg_max(body, seq) FROM events
        WHERE type = 'InputRejected' AND t > ? AND body LIKE '%"reason":"internal_error"%'""",
        [now - INTERNAL_ERROR_WINDOW_MS],
    ).fetchone()
    count, last_seq, body = rows
    if not count:
        return []
    detail = json.loads(body)["event"].get("detail", "")
    return [
        Alert(
            kind="internal_error",
            subject="scheduler",
            value=count,
            threshold=1,
            message=f"{count} input(s) made the scheduler's step raise in the last 24 h and were"
            f" rejected (last: XR_IN seq {last_seq}: {detail[:200]}); report it as a bug",
        )
    ]


def downgraded_waiting_alerts(con, now: int) -> list[Alert]:
    """One alert per queued job waiting below the level it asked for (its team is downgraded)."""
    rows = con.execute("""
        SELECT job, team, level, requested_level, queued_since_t FROM jobs
        WHERE state = 'queued' AND level > requested_level ORDER BY job""").fetchall()
    return [
        Alert(
            kind="downgraded_waiting",
            subject=f"job {job}",
            value=(now - since) / 1000,
            threshold=0.0,
            message=(
                f"job {job} of team {team} asked for level {asked} and waits at level {level}"
                f" for {(now - since) / 60_000:.0f} min: its team is downgraded until its"
                " preemption quota recovers"
            ),
        )
        for job, team, level, asked, since in rows
    ]


def rate_alerts(con, now: int, rule: RateRule = RateRule()) -> list[Alert]:
    """Levels whose rate of preempting, or of being preempted, is anomalous against their own
    history."""
    return _rate_alerts(con, now, rule, "sagas", "preemptor_level", "preempting") + _rate_alerts(
        con, now, rule, "preemptions", "victim_level", "preempted"
    )


def _rate_alerts(con, now: int, rule: RateRule, table: str, column: str, role: str) -> list[Alert]:
    start = now - rule.window_ms * (rule.history_windows + 1)
    rows = con.execute(
        f"""
        SELECT {column}, CAST(floor((? - planned_t) / ?) AS BIGINT) AS ago, count(*)
        FROM {table} WHERE planned_t > ? AND planned_t <= ? GROUP BY ALL""",
        [now, rule.window_ms, start, now],
    ).fetchall()
    counts: dict[int, dict[int, int]] = {}
    for level, ago, count in rows:
        counts.setdefault(level, {})[ago] = count
    out = []
    for level in sorted(counts):
        current = counts[level].get(0, 0)
        history = [counts[level].get(i, 0) for i in range(1, rule.history_windows + 1)]
        mean = sum(history) / len(history)
        std = math.sqrt(sum((x - mean) ** 2 for x in history) / len(history))
        threshold = max(rule.min_count, mean + rule.k * max(std, rule.std_floor))
        if current >= threshold:
            minutes = rule.window_ms // 60_000
            out.append(
                Alert(
                    kind="preemption_rate",
                    subject=f"level {level} ({role})",
                    value=current,
                    threshold=threshold,
                    message=(
                        f"level {level} {role}: {current} in the last {minutes} min, against"
                        f" {mean:.1f} ± {std:.1f} per {minutes} min over the previous"
                        f" {rule.history_windows} windows"
                    ),
                )
            )
    return out


def team_limit_alerts(con, now: int) -> list[Alert]:
    """Teams protected from preemption, or downgraded for preempting too much, as of `now`."""
    rows = con.execute(
        """
        SELECT team, kind, max(until_t), arg_max(count, t) FROM team_limits
        WHERE until_t > ? GROUP BY ALL ORDER BY ALL""",
        [now],
    ).fetchall()
    out = []
    for team, kind, until_t, count in rows:
        if kind == "protected":
            what = f"was preempted {count} times within the fairness window: protected from preemption"
        else:
            what = f"preempted others {count} times within the fairness window: its new urgent jobs are downgraded"
        out.append(
            Alert(
                kind=f"team_{kind}",
                subject=f"team {team}",
                value=count,
                threshold=count,
                message=f"team {team} {what} for {(until_t - now) / 60_000:.0f} more min",
            )
        )
    return out
