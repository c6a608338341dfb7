"""Readers never block: while `xirang dashboard` runs (a process of its own, projecting into
its own copy), `project`, `sql`, `alerts`, `ab report` and `report` work on the analysts'
projection in the same directory, and a reader waits out a writer's batch rather than fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from data_helpers import REPO, workload_records, write_jsonl, xirang

pytestmark = pytest.mark.timeout(120)


def test_analyst_commands_work_while_the_dashboard_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = write_jsonl(str(tmp_path / "events.jsonl"), workload_records(jobs=60))
    dash = subprocess.Popen(
        [sys.executable, "-m", "xirang.cli", "dashboard", "--log", log, "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert "dashboard on" in dash.stdout.readline()
        assert "projected" in dash.stdout.readline()  # it holds its copy from here on
        assert (tmp_path / ".xirang" / "dashboard.duckdb").exists()
        projected = xirang("project", "--log", log)
        assert projected.returncode == 0, projected.stderr
        count = xirang("sql", "SELECT count(*) AS n FROM events", "--json")
        assert count.returncode == 0 and json.loads(count.stdout)[0]["n"] > 0
        for args in (["alerts"], ["ab", "report"], ["report", "--out", "r.html"]):
            done = xirang(*args)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        why = xirang("sql", "SELECT code, count(*) AS n FROM pending GROUP BY code", "--json")
        assert why.returncode == 0, why.stderr  # the projection says why jobs wait (none at the end)
    finally:
        os.kill(dash.pid, signal.SIGTERM)
        dash.wait(10)


def test_a_reader_waits_for_a_writers_batch_instead_of_failing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = write_jsonl(str(tmp_path / "events.jsonl"), workload_records(jobs=30))
    assert xirang("project", "--log", log).returncode == 0
    db = str(tmp_path / ".xirang" / "projection.duckdb")
    code = (
        "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('holding', flush=True);"
        " time.sleep(1.5); con.close()"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, db], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        started = time.monotonic()
        done = xirang("sql", "SELECT count(*) AS n FROM jobs", "--json")
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started >= 0.5  # it waited for the writer to let go
    finally:
        writer.wait(10)
