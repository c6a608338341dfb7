"""The DuckDB projection: exactly once across a SIGKILL, rebuild equals incremental, and the
analyst commands (`xirang sql`, `xirang export`) on top of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import duckdb
import pytest

from projections.projector import ProjectionError, Projector
from data_helpers import (
    REPO,
    position,
    publish,
    start_nats,
    table_rows,
    workload_records,
    write_jsonl,
    xirang,
)
from core import types as T


@pytest.fixture
def nats(tmp_path):
    server = start_nats(tmp_path)
    yield server
    server.stop()


def test_projector_killed_with_sigkill_and_restarted_projects_exactly_once(nats, tmp_path):
    records = workload_records()
    last_seq = publish(nats.url, records)
    killed_db, clean_db = str(tmp_path / "killed.duckdb"), str(tmp_path / "clean.duckdb")

    # given a projector committing small batches, killed after its first commits
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xirang.cli",
            "project",
            "--nats",
            nats.url,
            "--db",
            killed_db,
            "--batch",
            "50",
            "--progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        for _ in range(3):
            assert proc.stdout.readline().startswith("committed seq")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    killed_at, _ = position(killed_db)
    assert 0 < killed_at < last_seq, "the kill must land in the middle of the projection"

    # when it restarts, and another projector runs uninterrupted
    restarted = xirang("project", "--nats", nats.url, "--db", killed_db)
    clean = xirang("project", "--nats", nats.url, "--db", clean_db)
    assert restarted.returncode == 0, restarted.stderr
    assert clean.returncode == 0, clean.stderr

    # then both hold exactly the same rows, each record once
    assert json.loads(restarted.stdout)["applied"] + killed_at >= len(records)
    killed_rows, clean_rows = table_rows(killed_db), table_rows(clean_db)
    assert killed_rows == clean_rows
    seqs = [row[0] for row in killed_rows["events"]]
    assert len(seqs) == len(set(seqs)) == len(records)
    assert position(killed_db)[1] == len(records)


def test_rebuild_from_seq_1_equals_incremental_projection(nats, tmp_path):
    records = workload_records()
    db = str(tmp_path / "incremental.duckdb")
    # given records arriving in four parts, projected after each one
    quarter = len(records) // 4
    for start in range(0, len(records), quarter):
        publish(nats.url, records[start : start + quarter])
        result = xirang("project", "--nats", nats.url, "--db", db, "--batch", "333")
        assert result.returncode == 0, result.stderr
    incremental = table_rows(db)
    # when the projection is rebuilt from sequence 1
    result = xirang("project", "--nats", nats.url, "--db", db, "--rebuild")
    assert result.returncode == 0, result.stderr
    # then it equals the incremental one, and it is not empty
    assert table_rows(db) == incremental
    assert len(incremental["events"]) == len(records)
    assert incremental["preemptions"] and incremental["sagas"] and incremental["queue_wait"]


def test_projection_is_the_same_from_jetstream_and_from_an_exported_file(nats, tmp_path):
    records = workload_records()
    publish(nats.url, records)
    path = write_jsonl(str(tmp_path / "log.jsonl"), records)
    a, b = str(tmp_path / "a.duckdb"), str(tmp_path / "b.duckdb")
    assert xirang("project", "--nats", nats.url, "--db", a).returncode == 0
    assert xirang("project", "--log", path, "--db", b).returncode == 0
    rows_a, rows_b = table_rows(a), table_rows(b)
    # stream sequences differ from line numbers (host copies share the stream)
    for table in ("jobs", "sagas", "preemptions", "team_usage", "nodes"):
        assert rows_a[table] == rows_b[table], table


def test_projection_tables_agree_with_the_log(tmp_path):
    records = workload_records()
    proj = Projector(str(tmp_path / "p.duckdb"))
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records, 1)])
    con = proj.con
    planned = [r.event for r in records if isinstance(r.event, T.PreemptionPlanned)]
    victims = sum(len(e.victims) for e in planned)
    assert con.execute("SELECT count(*) FROM sagas").fetchone()[0] == len(planned)
    assert con.execute("SELECT count(*) FROM preemptions").fetchone()[0] == victims
    benefit = con.execute("SELECT sum(benefit) FROM sagas").fetchone()[0]
    assert benefit == pytest.approx(sum(e.benefit for e in planned))
    finished = sum(isinstance(r.event, T.JobFinished) for r in records)
    assert con.execute("SELECT count(*) FROM jobs WHERE state = 'finished'").fetchone()[0] == finished
    running = sum(isinstance(r.event, T.JobRunning) for r in records)
    assert con.execute("SELECT count(*) FROM queue_wait").fetchone()[0] == running
    requeued_lost = sum(r.event.lost_progress_ms for r in records if isinstance(r.event, T.JobRequeued))
    assert con.execute("SELECT sum(lost_progress_ms) FROM team_usage").fetchone()[0] >= requeued_lost


def test_reclaims_are_marked_and_a_database_from_before_the_column_gains_it(tmp_path):
    from core.model.policy import Policy
    from replay.synthetic_log import Spec, generate

    # Reclaims come from the operators' opt-in cross-pool guarantee.
    records = tuple(generate(Spec(jobs=150, seed=7, policy=Policy(fair_share_guarantee=True))).records)
    planned = [r.event for r in records if isinstance(r.event, T.PreemptionPlanned)]
    reclaims = sorted(e.saga for e in planned if e.reclaim)
    assert reclaims and len(reclaims) < len(planned)  # the workload has both kinds
    half = len(records) // 2
    db = str(tmp_path / "p.duckdb")
    proj = Projector(db)
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records[:half], 1)])
    # As an older xirang left it: no reclaim column.
    proj.con.execute("DROP VIEW preemption_stats")
    for table in ("sagas", "preemptions"):
        proj.con.execute(f"ALTER TABLE {table} DROP COLUMN reclaim")
    proj.con.close()
    proj = Projector(db)
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records[half:], half + 1)])
    con = proj.con
    marked = [row[0] for row in con.execute("SELECT saga FROM sagas WHERE reclaim ORDER BY saga").fetchall()]
    later = sorted(
        r.event.saga for r in records[half:] if isinstance(r.event, T.PreemptionPlanned) and r.event.reclaim
    )
    assert later and sorted(marked) == later
    assert con.execute("SELECT count(*) FROM sagas").fetchone()[0] == len(planned)
    fresh = Projector(str(tmp_path / "fresh.duckdb"))
    fresh.apply([(i, T.encode(r)) for i, r in enumerate(records, 1)])
    assert (
        sorted(
            r[0] for r in fresh.con.execute("SELECT DISTINCT saga FROM preemptions WHERE reclaim").fetchall()
        )
        == reclaims
    )
    assert (
        fresh.con.execute("SELECT sum(reclaims) FROM preemption_stats").fetchone()[0]
        == fresh.con.execute("SELECT count(*) FROM preemptions WHERE reclaim").fetchone()[0]
    )


def test_projector_refuses_a_gap_and_keeps_what_it_had(tmp_path):
    records = workload_records()[:200]
    proj = Projector(str(tmp_path / "p.duckdb"))
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records[:100], 1)])
    with pytest.raises(ProjectionError, match="does not follow"):
        proj.apply([(i, T.encode(r)) for i, r in enumerate(records[101:], 102)])
    assert proj.con.execute("SELECT max(n) FROM events").fetchone()[0] == 100
    # a redelivered batch is skipped, not applied twice
    assert proj.apply([(i, T.encode(r)) for i, r in enumerate(records[:100], 1)]) == 0
    assert proj.con.execute("SELECT count(*) FROM events").fetchone()[0] == 100


def test_sql_prints_a_table_json_and_csv_and_explains_bad_sql(tmp_path):
    path = write_jsonl(str(tmp_path / "log.jsonl"), workload_records())
    db = str(tmp_path / "p.duckdb")
    assert xirang("project", "--log", path, "--db", db).returncode == 0
    query = "SELECT level, count(*) AS jobs FROM jobs GROUP BY level ORDER BY level"
    table = xirang("sql", query, "--db", db)
    assert table.returncode == 0 and table.stdout.splitlines()[0].split() == ["level", "jobs"]
    rows = json.loads(xirang("sql", query, "--db", db, "--json").stdout)
    assert sum(r["jobs"] for r in rows) == 150
    csv_lines = xirang("sql", query, "--db", db, "--csv").stdout.splitlines()
    assert csv_lines[0] == "level,jobs" and len(csv_lines) == len(rows) + 1
    bad = xirang("sql", "SELEC nonsense", "--db", db)
    assert bad.returncode == 2 and "SQL error" in bad.stderr
    missing = xirang("sql", "SELECT 1", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode == 2 and "xirang project" in missing.stderr


def test_export_writes_parquet_files_that_read_back(tmp_path):
    path = write_jsonl(str(tmp_path / "log.jsonl"), workload_records())
    db = str(tmp_path / "p.duckdb")
    assert xirang("project", "--log", path, "--db", db).returncode == 0
    out = tmp_path / "parquet"
    result = xirang("export", "--parquet", str(out), "--db", db)
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout)["rows"]
    con = duckdb.connect()
    for table in ("jobs", "preemptions", "events", "preemption_stats"):
        got = con.execute(f"SELECT count(*) FROM '{out / (table + '.parquet')}'").fetchone()[0]
        assert got == counts[table] > 0


def test_cordons_are_projected_and_counted_and_a_database_from_before_gains_the_columns(tmp_path):
    from projections import metrics
    from scenario import Run, node

    run = Run()
    run.at(1, node("h1"), node("h2"), node("h3"))
    first = len(run.records)
    run.at(2, T.NodeHealth(node="h1", healthy=False, reason="disk almost full"))
    run.at(3, T.CordonNode(node="h2", reason="PSU swap", by="ana"))
    run.at(4, T.CordonNode(node="h3", reason="cables", by="ana"), T.UncordonNode(node="h3", by="ana"))
    records = run.records
    db = str(tmp_path / "p.duckdb")
    proj = Projector(db)
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records[:first], 1)])
    for column in ("cordoned_by", "cordon_reason"):  # as an older xirang left it
        proj.con.execute(f"ALTER TABLE nodes DROP COLUMN {column}")
    proj.con.close()
    proj = Projector(db)
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records[first:], first + 1)])
    rows = proj.con.execute("SELECT node, cordoned_by, cordon_reason FROM nodes ORDER BY node").fetchall()
    assert rows == [("h1", "host:h1", "disk almost full"), ("h2", "op:ana", "PSU swap"), ("h3", "", "")]
    assert "xirang_nodes_cordoned 2.0" in metrics.prometheus(proj.con, input_backlog=0)
