"""Shared set-up for the data tests: a real nats-server with the XR_EV stream, logs made by
the simulator (`replay.synthetic_log`) through `core.step`, and the CLI run as a real subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
from functools import lru_cache

import duckdb

from transport import bus
from transport.natsd import EmbeddedNats
from core import types as T
from projections import logsource
from replay.synthetic_log import Spec, generate
from xirang import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
COMPARED_TABLES = (
    "events",
    "job_events",
    "jobs",
    "sagas",
    "preemptions",
    "queue_wait",
    "team_usage",
    "ledger",
    "nodes",
    "team_limits",
    "declines",
    "policy_changes",
    "feedback",
    "notices",
)


@lru_cache(maxsize=8)
def workload_records(jobs: int = 150, seed: int = 7, storm: bool = False) -> tuple[T.Record, ...]:
    spec = Spec(jobs=jobs, seed=seed)
    if storm:
        spec.storm_t, spec.storm_jobs = 4 * 3600 * 1000, 6
    return tuple(generate(spec).records)


def write_jsonl(path: str, records) -> str:
    with open(path, "wb") as fh:
        for record in records:
            fh.write(T.encode_record(record) + b"\n")
    return path


def xirang(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the CLI in this process (the interpreter's start-up is most of a command's time);
    tests that need a process of its own to kill start one with `xirang_process`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["xirang", *args], code, out.getvalue(), err.getvalue())


def xirang_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def publish(url: str, records) -> int:
    async def go() -> int:
        nc, js = await bus.connect(url)
        try:
            await bus.ensure_streams(js)
            return await logsource.publish_records(nc, js, list(records))
        finally:
            await nc.close()

    return asyncio.run(go())


def start_nats(tmp_path) -> EmbeddedNats:
    return EmbeddedNats(tmp_path / "nats").start()


def table_rows(db: str) -> dict[str, list[tuple]]:
    """Every compared table, sorted, for equality checks between two projections."""
    con = duckdb.connect(db, read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in COMPARED_TABLES}
    finally:
        con.close()


def position(db: str) -> tuple[int, int]:
    con = duckdb.connect(db, read_only=True)
    try:
        row = con.execute("SELECT last_seq, last_n FROM projector_position").fetchone()
        return row or (0, 0)
    finally:
        con.close()
