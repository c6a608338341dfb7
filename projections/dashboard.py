"""The live web dashboard and the Prometheus endpoint, served by xirang itself.

A stdlib `ThreadingHTTPServer` in a daemon thread reads the same DuckDB database the
projector writes (each request on its own cursor, so it sees the last committed batch).

Routes: `/` the page (rendered on the server, so the numbers are in the HTML, and
refreshed every two seconds by a few lines of JavaScript fetching `/fragment`);
`/metrics` Prometheus text; `/api/snapshot` the same numbers as JSON; `/api/sql?q=SELECT…`
read-only SQL as JSON for analysts with the token (`projections/analyst_sql.py` says how it
is kept read-only); `/healthz`.
"""

from __future__ import annotations

import html
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import duckdb

from . import metrics
from .analyst_sql import AnalystSql, Refused, lock_down
from core.explain import human_duration

from .audit import fmt_t

REFRESH_MS = 2000

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#0f1419;color:#d8dee9}
header{padding:12px 20px;background:#1b2430;display:flex;gap:28px;align-items:baseline;flex-wrap:wrap}
h1{font-size:20px;margin:0;color:#88c0d0} h2{font-size:16px;margin:18px 0 6px;color:#88c0d0}
main{padding:0 20px 20px} .kpi b{font-size:20px;color:#eceff4;display:block}
.kpi{color:#8fa1b3;font-size:12px} table{border-collapse:collapse;margin-bottom:8px;width:100%}
th,td{padding:3px 8px;border-bottom:1px solid #2b3644;text-align:right;white-space:nowrap}
th{color:#8fa1b3;font-weight:500} td:first-child,th:first-child{text-align:left}
.alerts{background:#4c1d1d;border:1px solid #bf616a;padding:8px 12px;border-radius:4px}
.ok{background:#1d3b2a;border:1px solid #a3be8c;padding:8px 12px;border-radius:4px}
.reason{text-align:left;white-space:normal;color:#8fa1b3}
.note{color:#8fa1b3;font-size:12px;margin:0} .committed{color:#a3be8c} .rolled_back{color:#bf616a} .open{color:#ebcb8b}
"""

_JS = f"""
setInterval(async () => {{
  try {{
    const r = await fetch('/fragment', {{cache: 'no-store'}});
    if (r.ok) document.getElementById('live').innerHTML = await r.text();
  }} catch (e) {{}}
}}, {REFRESH_MS});
"""


def _e(value) -> str:
    return html.escape(str(value))


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _dur(ms) -> str:
    return "–" if ms is None else human_duration(ms)


def _pct(ratio) -> str:
    return "–" if ratio is None else f"{100 * ratio:.0f}%"


def _group_table(rows: list[dict], key: str, title: str) -> str:
    head = (
        "<tr><th>{}</th><th>queued</th><th>oldest wait</th><th>mean wait (1 h)</th>"
        "<th>running GPUs</th><th>preempted</th><th>preempting</th><th>success</th>"
        "<th>preemption wait</th><th>victim recovery</th><th>lost GPU-h</th>"
        "<th>fee credit</th></tr>"
    ).format(_e(key))
    body = []
    for r in rows:
        k = _e(r[key])
        body.append(
            f'<tr data-{key}="{k}"><td>{k}</td><td data-metric="queued">{r["queued"]}</td>'
            f"<td>{_dur(r['oldest_wait_ms'] or None)}</td><td>{_dur(r['wait_ms_mean'])}</td>"
            f'<td data-metric="running_gpus">{_num(r["running_gpus"])}</td>'
            f'<td data-metric="preempted">{r["preempted"]}</td>'
            f'<td data-metric="preempting">{r["preemptions_started"]}</td>'
            f"<td>{_pct(r['preemption_success_rate'])}</td><td>{_dur(r['preemption_wait_ms_mean'])}</td>"
            f"<td>{_dur(r['victim_recovery_ms_mean'])}</td><td>{_num(r['lost_gpu_hours'], 2)}</td>"
            f"<td>{_num(r['fee_credit'], 2)}</td></tr>"
        )
    return f"<h2>{_e(title)}</h2><table>{head}{''.join(body)}</table>"


def _timeline_svg(rows: list[dict], now: int) -> str:
    """Recent preemptions on a time strip: one bar per saga, taller for a larger net benefit."""
    if not rows:
        return ""
    t0 = min(r["planned_t"] for r in rows)
    span = max(1, now - t0)
    net_max = max(abs(r["net"] or 0) for r in rows) or 1
    colors = {"committed": "#a3be8c", "rolled_back": "#bf616a", "open": "#ebcb8b"}
    bars = []
    for r in rows:
        x = 10 + 1180 * (r["planned_t"] - t0) / span
        h = 8 + 52 * abs(r["net"] or 0) / net_max
        bars.append(
            f'<rect x="{x:.1f}" y="{70 - h:.1f}" width="6" height="{h:.1f}" '
            f'fill="{colors.get(r["outcome"], "#88c0d0")}"><title>{_e(r["saga"])}: '
            f"{_e(r['preemptor'])} net {_num(r['net'], 0)}</title></rect>"
        )
    return (
        f'<svg id="timeline" width="1200" height="90" style="background:#1b2430">'
        f'{"".join(bars)}<text x="10" y="86" fill="#8fa1b3" font-size="11">{_e(fmt_t(t0))}</text>'
        f'<text x="1080" y="86" fill="#8fa1b3" font-size="11">{_e(fmt_t(now))}</text></svg>'
    )


def _timeline_table(rows: list[dict]) -> str:
    body = "".join(
        f"<tr><td>{_e(fmt_t(r['planned_t']))}</td><td>{_e(r['saga'])}</td>"
        f"<td>{_e(r['preemptor'])} (L{r['preemptor_level']}, {_e(r['preemptor_team'])})</td>"
        f"<td>{_e(r['victim_jobs'] or '')}</td><td>{_num(r['benefit'], 0)}</td><td>{_num(r['cost'], 0)}</td>"
        f'<td class="{_e(r["outcome"])}">{_e(r["outcome"])}</td><td>{_dur(r["wait_ms"])}</td>'
        f'<td class="reason">{_e(r["rollback_reason"] or r["reason"])}</td></tr>'
        for r in rows
    )
    return (
        "<table><tr><th>planned</th><th>saga</th><th>preemptor</th><th>victims</th>"
        "<th>benefit</th><th>cost</th><th>outcome</th><th>wait</th><th>reason</th></tr>"
        f"{body}</table>"
    )


def _expected_start(ms) -> str:
    if ms is None:
        return "never, as the pool stands"
    return "now" if ms <= 0 else "in " + _dur(ms)


def _pending_table(rows: list[dict]) -> str:
    if not rows:
        return '<h2>Why jobs wait</h2><p class="note" id="pending">No job is waiting.</p>'
    body = "".join(
        f'<tr data-job="{_e(r["job"])}"><td>{_e(r["job"])}</td><td>{_e(r["team"])}</td><td>{_e(r["user"])}</td>'
        f"<td>{r['level']}{'^' + str(r['eff_level']) if r['eff_level'] != r['level'] else ''}</td>"
        f"<td>{r['gpus']}</td><td>{_dur(r['wait_ms'])}</td>"
        f"<td>{_expected_start(r['start_in_ms'])}</td>"
        f'<td class="code">{_e(r["code"])}</td><td class="reason">{_e(r["reason"])}</td></tr>'
        for r in rows
    )
    return (
        '<h2>Why jobs wait</h2><table id="pending"><tr><th>job</th><th>team</th><th>user</th><th>level</th>'
        "<th>GPUs</th><th>waiting</th><th>expected start</th><th>reason</th><th>why</th></tr>"
        f"{body}</table>"
    )


def render_fragment(snap: dict) -> str:
    """The dashboard's live part as HTML (what the page reloads every 2 s)."""
    t = snap["totals"]
    kpis = [
        ("log time", fmt_t(snap["now_t"]), "now"),
        ("events projected", t["events"], "events"),
        ("last seq", t["last_seq"], "last-seq"),
        ("pool GPUs", t["pool_gpus"], "pool-gpus"),
        ("running GPUs", t["running_gpus"], "running-gpus"),
        ("queued jobs", t["queued"], "queued"),
        ("preemptions", t["preemptions"], "preemptions"),
        ("committed / rolled back", f"{t['committed']} / {t['rolled_back']}", "outcomes"),
        ("lost GPU-hours", _num(float(t["lost_gpu_hours"]), 2), "lost"),
        ("fee credit", _num(float(t["fee_credit"]), 2), "fee-credit"),
        ("jobs done", t["jobs_done"], "jobs-done"),
    ]
    header = "".join(
        f'<div class="kpi">{_e(label)}<b id="kpi-{key}">{_e(value)}</b></div>' for label, value, key in kpis
    )
    if snap["alerts"]:
        alerts = (
            '<div class="alerts" id="alerts"><b>Alerts</b><ul>'
            + "".join(f'<li data-kind="{_e(a["kind"])}">{_e(a["message"])}</li>' for a in snap["alerts"])
            + "</ul></div>"
        )
    else:
        alerts = '<div class="ok" id="alerts">No alerts: preemption rates within their recent history, no team at its limits.</div>'
    return (
        f"<header><h1>xirang</h1>{header}</header><main>{alerts}"
        f"{_pending_table(snap.get('pending', []))}"
        f"{_group_table(snap['levels'], 'level', 'By level')}"
        '<p class="note">Queued jobs count at their queue level (after aging and boosts);'
        " everything else at the level they were submitted at (victims: their own level,"
        " preempting: the preemptor's).</p>"
        f"{_group_table(snap['teams'], 'team', 'By team')}"
        f"{_group_table(snap['users'], 'user', 'By user')}"
        f"<h2>Recent preemptions</h2>{_timeline_svg(snap['timeline'], snap['now_t'])}"
        f"{_timeline_table(snap['timeline'])}{_satisfaction_table(snap.get('satisfaction', []))}</main>"
    )


def _satisfaction_table(rows: list[dict]) -> str:
    """Survey answers per team and level (`xirang feedback`)."""
    if not rows:
        return '<h2>Satisfaction</h2><p class="note" id="satisfaction">No survey answers yet (`xirang feedback JOB --score 1..5`).</p>'
    body = "".join(
        f"<tr><td>{_e(r['team'])}</td><td>{_e(r['level'])}</td><td>{_e(r['answers'])}</td>"
        f"<td>{_num(float(r['score_mean']), 2)}</td><td>{_e(r['unhappy'])}</td></tr>"
        for r in rows
    )
    return (
        '<h2>Satisfaction</h2><table id="satisfaction"><tr><th>team</th><th>level</th><th>answers</th>'
        f"<th>mean score (1..5)</th><th>unhappy (1-2)</th></tr>{body}</table>"
    )


def render_page(snap: dict) -> str:
    """The whole dashboard page: the live fragment, its style and the script that refreshes it."""
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>xirang dashboard</title>'
        f'<style>{_CSS}</style></head><body><div id="live">{render_fragment(snap)}</div>'
        f"<script>{_JS}</script></body></html>"
    )


class _Handler(BaseHTTPRequestHandler):
    con: duckdb.DuckDBPyConnection  # set on the subclass made by `serve`
    sql: AnalystSql

    def log_message(self, *args) -> None:  # quiet: the dashboard is polled every 2 s
        return None

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlparse(self.path)
        cur = self.con.cursor()
        try:
            if url.path == "/":
                self._send(200, "text/html; charset=utf-8", render_page(metrics.snapshot(cur)))
            elif url.path == "/fragment":
                self._send(200, "text/html; charset=utf-8", render_fragment(metrics.snapshot(cur)))
            elif url.path == "/metrics":
                self._send(
                    200,
                    metrics.PROMETHEUS_CONTENT_TYPE,
                    metrics.prometheus(cur, self.live.get("input_backlog")),
                )
            elif url.path == "/api/snapshot":
                self._send(200, "application/json", json.dumps(metrics.snapshot(cur), default=str))
            elif url.path == "/api/sql":
                self._sql(cur, parse_qs(url.query).get("q", [""])[0])
            elif url.path == "/healthz":
                self._send(200, "text/plain", "ok\n")
            else:
                self._send(404, "text/plain", "not found: try /, /metrics, /api/snapshot, /api/sql?q=\n")
        finally:
            cur.close()

    def _sql(self, cur, query: str) -> None:
        try:
            self.sql.check_token(self.headers.get("Authorization"))
            rows, truncated = self.sql.run(cur, query)
        except Refused as err:
            return self._send(err.status, "application/json", json.dumps({"error": str(err)}))
        except duckdb.Error as err:
            return self._send(400, "application/json", json.dumps({"error": str(err)}))
        self._send(
            200,
            "application/json",
            json.dumps(rows, default=str),
            {"X-Xirang-Truncated": "true"} if truncated else None,
        )

    def _send(self, status: int, ctype: str, body: str, headers: dict | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


def serve(
    con: duckdb.DuckDBPyConnection,
    host: str = "127.0.0.1",
    port: int = 0,
    sql: AnalystSql | None = None,
    live: dict | None = None,
) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; `server.server_address` has the port. The database
    is locked down first (no file access, configuration locked) for `/api/sql`'s sake.
    `live` holds what the follower learns beside the log (`input_backlog`: inputs on XR_IN
    not answered in the log yet), for /metrics."""
    limits = sql or AnalystSql(token="")
    lock_down(con, limits.memory_limit_mb, limits.threads)
    handler = type(
        "DashboardHandler",
        (_Handler,),
        {"con": con, "sql": sql or AnalystSql(token=""), "live": live if live is not None else {}},
    )
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    return server
