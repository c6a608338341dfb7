"""The monitoring kit in deploy/monitoring: every series the Prometheus alert rules and the
Grafana dashboard use is one /metrics exports, and the rules cover what operators page on
(an urgent job waiting past its bound, a rolled-back saga, a lost node, a stuck input)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb

from core import types as T
from data_helpers import REPO, workload_records
from projections import metrics
from projections.projector import Projector

MONITORING = Path(REPO) / "deploy" / "monitoring"
HISTOGRAM_PARTS = re.compile(r"_(bucket|sum|count)$")


def exported_families() -> set[str]:
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode(r)) for i, r in enumerate(workload_records(jobs=40), 1)])
    text = metrics.prometheus(proj.con, input_backlog=0)
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def used_series(text: str) -> set[str]:
    return {HISTOGRAM_PARTS.sub("", name) for name in re.findall(r"\bxirang_[a-z_]+", text)}


def test_alert_rules_use_exported_series_and_cover_the_operators_pages():
    rules = (MONITORING / "alerts.yml").read_text()
    exprs = re.findall(r"^\s+expr: (.+)$", rules, re.M)
    assert exprs and used_series("\n".join(exprs)) <= exported_families()
    names = set(re.findall(r"^\s+- alert: (\S+)$", rules, re.M))
    assert {
        "XirangUrgentJobWaiting",
        "XirangPreemptionRolledBack",
        "XirangNodeLost",
        "XirangInputStuck",
    } <= names


def test_grafana_dashboard_is_json_whose_queries_use_exported_series():
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    assert len(exprs) >= 10 and used_series("\n".join(exprs)) <= exported_families()
    assert any("histogram_quantile" in e and "xirang_level_queue_wait_seconds_bucket" in e for e in exprs)
