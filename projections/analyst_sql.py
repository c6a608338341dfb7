"""The analyst's SQL endpoint behind the dashboard's `/api/sql`: read-only, by construction.

A query is refused unless every one of these holds, each a separate wall:
- a token: the request carries `Authorization: Bearer <token>` equal to the dashboard's
  (`--sql-token-file` or `$XIRANG_SQL_TOKEN`); without one configured, the endpoint is off;
- DuckDB's own parser finds exactly one statement and it is a `SELECT` (not string
  matching: `EXPLAIN ANALYZE DELETE`, `COPY`, `ATTACH`, `INSTALL`, `SET`, `PRAGMA` are
  other statement types);
- the database has `enable_external_access = false` and `lock_configuration = true`, set
  once before serving, so no function can read or write a file (`read_csv`, `read_text`,
  `glob`, extensions) and no query can turn that back on;
- the statement runs inside a transaction that is always rolled back, is interrupted after
  `time_limit_s`, and returns at most `rows_max` rows (the answer says it was truncated);
- the database may use at most `memory_limit_mb` of memory and `threads` threads (set with
  the lock, so no query can raise them): a query that needs more is refused with an
  out-of-memory answer instead of taking the host's memory;
- one query at a time per token: a second one while the first runs is refused (429), so
  one analyst cannot stack queries until the limits above multiply.
"""

from __future__ import annotations

import hmac
import os
import threading
from dataclasses import dataclass

import duckdb

TOKEN_ENV = "XIRANG_SQL_TOKEN"
TIME_LIMIT_S = 5.0
ROWS_MAX = 10_000
# DuckDB's own default is 80% of the machine's memory, for every query at once.
MEMORY_LIMIT_MB = 1024
THREADS = 2


class Refused(Exception):
    """A query the endpoint will not run: `status` (HTTP) and words that say why."""

    def __init__(self, status: int, words: str) -> None:
        super().__init__(words)
        self.status = status


def lock_down(
    con: duckdb.DuckDBPyConnection, memory_limit_mb: float = MEMORY_LIMIT_MB, threads: int = THREADS
) -> None:
    """No file access, at most `memory_limit_mb` of memory and `threads` threads, and no
    configuration changes from here on, for this database."""
    con.execute(f"SET memory_limit = '{float(memory_limit_mb):g}MB'")
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def token_from(path: str | None) -> str:
    """The token from a file (no secrets on command lines), else the environment."""
    if path:
        with open(path) as fh:
            return fh.read().strip()
    return os.environ.get(TOKEN_ENV, "")


@dataclass
class AnalystSql:
    """The dashboard's read-only SQL endpoint for analysts: a bearer token, a time limit and a
    row cap per query."""

    token: str
    time_limit_s: float = TIME_LIMIT_S
    rows_max: int = ROWS_MAX
    memory_limit_mb: float = MEMORY_LIMIT_MB
    threads: int = THREADS

    def __post_init__(self) -> None:
        self._running = threading.Lock()  # one query at a time (there is one token)

    def check_token(self, authorization: str | None) -> None:
        """Raise `Refused` (403) unless the request carries the configured bearer token."""
        if not self.token:
            raise Refused(
                403, f"/api/sql is off: start the dashboard with --sql-token-file FILE or ${TOKEN_ENV}"
            )
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise Refused(401, "send the dashboard's token: Authorization: Bearer <token>")

    def run(self, cur: duckdb.DuckDBPyConnection, query: str) -> tuple[list[dict], bool]:
        """(rows as dicts, truncated at rows_max)."""
        statements = cur.extract_statements(query)
        if len(statements) != 1 or statements[0].type.name != "SELECT":
            kinds = ", ".join(s.type.name for s in statements) or "none"
            raise Refused(400, f"give exactly one SELECT statement in q= (got: {kinds})")
        if not self._running.acquire(blocking=False):
            raise Refused(
                429, "one query at a time per token: send the next once the one running has answered"
            )
        try:
            return self._run(cur, query)
        finally:
            self._running.release()

    def _run(self, cur: duckdb.DuckDBPyConnection, query: str) -> tuple[list[dict], bool]:
        timer = threading.Timer(self.time_limit_s, cur.interrupt)
        cur.begin()
        timer.start()
        try:
            result = cur.execute(query)
            names = [d[0] for d in result.description]
            rows = result.fetchmany(self.rows_max + 1)
        except duckdb.InterruptException as err:
            raise Refused(400, f"the query ran past {self.time_limit_s:g} s and was stopped") from err
        except duckdb.OutOfMemoryException as err:
            raise Refused(
                400,
                f"the query needs more than the endpoint's {self.memory_limit_mb:g} MB of memory:"
                " aggregate more, select fewer columns or rows",
            ) from err
        finally:
            timer.cancel()
            cur.rollback()
        return [dict(zip(names, row)) for row in rows[: self.rows_max]], len(rows) > self.rows_max
