"""The analyst SQL endpoint's limits, on a locked-down database: a query that runs too
long is stopped, an answer is cut at its row limit, and nothing it runs is kept."""

from __future__ import annotations

import duckdb
import pytest

from projections.analyst_sql import AnalystSql, Refused, lock_down


@pytest.fixture
def con():
    con = duckdb.connect()
    con.execute("CREATE TABLE jobs AS SELECT range AS id FROM range(100)")
    lock_down(con)
    yield con
    con.close()


def test_a_query_past_its_time_limit_is_stopped(con):
    sql = AnalystSql(token="t", time_limit_s=0.2)
    with pytest.raises(Refused, match="past 0.2 s"):
        sql.run(con.cursor(), "SELECT count(*) FROM range(100000000000) a")


def test_an_answer_is_cut_at_its_row_limit(con):
    rows, truncated = AnalystSql(token="t", rows_max=7).run(con.cursor(), "SELECT id FROM jobs ORDER BY id")
    assert [r["id"] for r in rows] == list(range(7)) and truncated


def test_without_a_configured_token_the_endpoint_is_off_and_a_wrong_token_is_refused():
    with pytest.raises(Refused) as off:
        AnalystSql(token="").check_token("Bearer anything")
    assert off.value.status == 403
    with pytest.raises(Refused) as wrong:
        AnalystSql(token="right").check_token("Bearer wrong")
    assert wrong.value.status == 401
    AnalystSql(token="right").check_token("Bearer right")


def test_the_locked_down_database_cannot_be_unlocked(con):
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")
