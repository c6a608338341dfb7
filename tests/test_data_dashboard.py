"""Monitoring: the live dashboard in headless Chromium, the Prometheus endpoint, and the
alerts on an injected preemption storm."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import duckdb
import pytest

from core import rebuild
from core import types as T
from core.explain import explain
from core.model.entities import HOLDING, QUEUED
from prometheus_client.parser import text_string_to_metric_families

from projections import alerts, dashboard, metrics
from projections.projector import Projector
from data_helpers import REPO, publish, start_nats, workload_records
from replay.synthetic_log import Spec, generate

HOUR = 3_600_000
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
]


def chromium() -> str:
    """Debian's chromium, installed here when missing (the test set-up needs root for that)."""
    found = shutil.which("chromium")
    if not found and os.geteuid() == 0:
        subprocess.run(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium",
            shell=True,
            check=False,
            timeout=600,
            capture_output=True,
        )
        found = shutil.which("chromium")
    if not found:
        pytest.fail("chromium is missing: run `apt-get update && apt-get install -y chromium` as root")
    return found


def run_chromium(url: str, tmp_path, *mode: str) -> str:
    profile = tmp_path / f"chromium-{time.monotonic_ns()}"
    result = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *mode, url],
        capture_output=True,
        text=True,
        timeout=90,
    )
    return result.stdout


SQL_TOKEN = "analyst-token-1"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def wait_for(predicate, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def expected_numbers(records) -> dict:
    """What the dashboard must show, from the core's own state (not the projection)."""
    c = rebuild(records).canonical
    return {
        "events": len(records),
        "queued": sum(j.state == QUEUED for j in c.jobs.values()),
        "running-gpus": sum(j.gpus for j in c.jobs.values() if j.state in HOLDING),
        "preemptions": sum(isinstance(r.event, T.PreemptionPlanned) for r in records),
    }


def kpis(dom: str) -> dict:
    return {key: int(value) for key, value in re.findall(r'id="kpi-([a-z-]+)">(\d+)<', dom)}


@pytest.fixture
def live_dashboard(tmp_path):
    server = start_nats(tmp_path)
    proc = None
    try:
        publish(server.url, workload_records()[:10])  # the stream exists before the dashboard
        (tmp_path / "sql.token").write_text(SQL_TOKEN + "\n")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "xirang.cli",
                "dashboard",
                "--nats",
                server.url,
                "--db",
                str(tmp_path / "dash.duckdb"),
                "--port",
                "0",
                "--sql-token-file",
                str(tmp_path / "sql.token"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        line = proc.stdout.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", line).group(1))
        yield server, f"http://127.0.0.1:{port}"
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        server.stop()


def test_dashboard_renders_live_numbers_in_headless_chromium(live_dashboard, tmp_path):
    server, url = live_dashboard
    records = workload_records()
    # two moments at which jobs wait (so the why-jobs-wait table has rows to show)
    cut1 = max(i for i, r in enumerate(records) if r.event.t <= 2 * HOUR) + 1
    cut2 = max(i for i, r in enumerate(records) if r.event.t <= 6 * HOUR) + 1
    for cut in (cut1, cut2):
        # given the scheduler has written the log up to this point
        publish(server.url, records[10:cut] if cut == cut1 else records[cut1:cut])
        want = expected_numbers(records[:cut])
        wait_for(lambda: json.loads(get(url + "/api/snapshot"))["totals"]["events"] == cut)
        # when a browser opens the dashboard
        dom = run_chromium(url + "/", tmp_path, "--dump-dom")
        shown = kpis(dom)
        # then it shows the live numbers of the log so far
        for key, value in want.items():
            assert shown[key] == value, (key, shown, want)
        # and why each waiting job waits, as core/explain.py says from the core's own state
        reasons = dict(
            re.findall(r'<tr data-job="([^"]+)">(?:<td>[^<]*</td>){7}<td class="code">([a-z_]+)</td>', dom)
        )
        state = rebuild(records[:cut])
        waiting = sum(j.state in (QUEUED, "reserved", "held") for j in state.canonical.jobs.values())
        assert reasons and len(reasons) == min(metrics.PENDING_SHOWN_MAX, waiting)
        assert reasons == {job: explain(state, job).code for job in reasons}
    assert want["queued"] + want["running-gpus"] > 0 and want["preemptions"] > 0
    png = tmp_path / "dashboard.png"
    run_chromium(url + "/", tmp_path, f"--screenshot={png}")
    assert png.exists() and png.stat().st_size > 20_000
    shutil.copy(png, os.environ.get("XIRANG_SCREENSHOT", tmp_path / "dashboard-copy.png"))


def prometheus_samples(text: str) -> list[tuple[str, dict, float]]:
    """Every sample of a /metrics text, as prometheus_client's parser reads it."""
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def test_metrics_endpoint_speaks_prometheus_text(live_dashboard):
    server, url = live_dashboard
    records = workload_records()
    cut = max(i for i, r in enumerate(records) if r.event.t <= 5 * HOUR) + 1
    publish(server.url, records[10:cut])
    wait_for(lambda: json.loads(get(url + "/api/snapshot"))["totals"]["events"] == cut)
    text = get(url + "/metrics").decode()
    samples = prometheus_samples(text)  # the library's own parser reads every line
    c = rebuild(records[:cut]).canonical
    queued = {
        level: sum(j.state == QUEUED and j.eff_level == level for j in c.jobs.values())
        for level in range(T.LEVELS)
    }
    shown = {
        int(labels["level"]): int(value)
        for name, labels, value in samples
        if name == "xirang_level_queue_jobs"
    }
    assert sum(queued.values()) > 0, "set-up: jobs wait at the cut"
    assert {level: shown.get(level, 0) for level in queued} == queued
    assert ("xirang_queue_jobs", {}, sum(j.state == QUEUED for j in c.jobs.values())) in samples
    assert ("xirang_projected_events_total", {}, cut) in samples
    # No job or user id in any label.
    ids = set(c.jobs) | set(c.done) | {j.user for j in c.jobs.values()}
    assert not [s for s in samples if set(s[1]) & {"job", "user"} or set(s[1].values()) & ids]
    assert "# TYPE xirang_level_queue_wait_seconds histogram" in text
    # conventions: one family per grouping, counters end in _total, no job ids in labels
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert all(name.startswith("xirang_") for name in families)
    assert all(name.endswith("_total") for name, kind in families.items() if kind == "counter")
    assert not re.search(r"\{[^}]*job=", text)
    for line in text.splitlines():
        if line.startswith("xirang_level_"):
            assert "team=" not in line and "user=" not in line, line


def _sql(url: str, query: str, token: str | None = SQL_TOKEN) -> tuple[int, object]:
    request = urllib.request.Request(url + "/api/sql?" + urllib.parse.urlencode({"q": query}))
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_sql_over_http_answers_one_select_with_the_token_and_refuses_everything_else(
    live_dashboard, tmp_path
):
    _, url = live_dashboard
    assert wait_for(lambda: _sql(url, "SELECT count(*) AS n FROM events") == (200, [{"n": 10}]))
    assert _sql(url, "SELECT 1", token=None)[0] == 401
    assert _sql(url, "SELECT 1", token="wrong")[0] == 401
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    attacks = [
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM read_text('{secret}')",
        f"SELECT * FROM glob('{tmp_path}/*')",
        f"COPY events TO '{tmp_path}/out.csv'",
        f"EXPLAIN ANALYZE COPY events TO '{tmp_path}/out2.csv'",
        "EXPLAIN ANALYZE DELETE FROM events",
        "DELETE FROM events",
        "DROP TABLE jobs",
        "INSTALL httpfs",
        f"ATTACH '{tmp_path}/x.duckdb' AS x",
        "SET enable_external_access = true",
        "SELECT 1; DELETE FROM events",
        "SELECT * FROM query('DELETE FROM events')",
    ]
    for attack in attacks:
        status, answer = _sql(url, attack)
        assert status == 400 and "error" in answer, (attack, answer)
    assert not list(tmp_path.glob("out*.csv")) and not (tmp_path / "x.duckdb").exists()
    assert _sql(url, "SELECT count(*) AS n FROM events") == (200, [{"n": 10}])  # nothing was deleted


def _alerts_at(spec: Spec, at_t: int) -> tuple[list[alerts.Alert], str, str]:
    records = [r for r in generate(spec).records if r.event.t <= at_t]
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records, 1)])
    page = dashboard.render_fragment(metrics.snapshot(proj.con))
    return alerts.evaluate(proj.con, metrics.now_t(proj.con)), page, metrics.prometheus(proj.con)


def test_alert_fires_on_an_injected_preemption_storm_and_not_without_it():
    storm_t, at_t = 8 * HOUR, 8 * HOUR + 10 * 60_000
    calm, calm_page, calm_metrics = _alerts_at(Spec(jobs=300, seed=5), at_t)
    storm, page, text = _alerts_at(
        Spec(jobs=300, seed=5, storm_t=storm_t, storm_jobs=24, storm_level=1), at_t
    )
    assert calm == [] and "No alerts" in calm_page
    assert not [s for s in prometheus_samples(calm_metrics) if s[0] == "xirang_alert_firing"]
    rate = [a for a in storm if a.kind == "preemption_rate"]
    assert any(a.subject == "level 1 (preempting)" for a in rate), storm
    assert all(a.value >= a.threshold for a in rate)
    limits = [a for a in storm if a.kind == "team_downgraded"]
    assert [a.subject for a in limits] == ["team storm"]
    # and the dashboard and /metrics show them
    assert 'data-kind="preemption_rate"' in page and 'data-kind="team_downgraded"' in page
    firing = ("xirang_alert_firing", {"kind": "preemption_rate", "subject": "level 1 (preempting)"}, 1)
    assert firing in prometheus_samples(text)


def _dashboard_peak_rss_mb(tmp_path) -> int:
    """The dashboard process's peak resident memory (VmHWM), found by its database path."""
    db = str(tmp_path / "dash.duckdb").encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                if db not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/status") as fh:
                return next(int(line.split()[1]) // 1024 for line in fh if line.startswith("VmHWM:"))
        except OSError:
            continue
    raise AssertionError("no dashboard process found")


def test_sql_over_http_is_held_to_its_memory_limit_and_one_query_at_a_time(live_dashboard, tmp_path):
    _, url = live_dashboard
    assert wait_for(lambda: _sql(url, "SELECT count(*) AS n FROM events") == (200, [{"n": 10}]))
    # Three gigabytes of string in one aggregate: refused at the endpoint's memory limit
    # (DuckDB's own default would let it take 80% of the machine's memory).
    hungry = "SELECT max(length(s)) FROM (SELECT string_agg(repeat('x', 1000), ',') AS s FROM range(3000000))"
    status, answer = _sql(url, hungry)
    assert status == 400 and "memory" in answer["error"], answer
    assert _dashboard_peak_rss_mb(tmp_path) < 1536
    slow = {}
    first = threading.Thread(
        target=lambda: slow.update(answer=_sql(url, "SELECT count(*) FROM range(100000000000)"))
    )
    first.start()
    time.sleep(1.0)
    status, answer = _sql(url, "SELECT 1 AS one")
    first.join(30)
    assert status == 429 and "one query at a time" in answer["error"], answer
    assert slow["answer"][0] == 400 and "past" in slow["answer"][1]["error"]
    assert _sql(url, "SELECT 1 AS one") == (200, [{"one": 1}])
