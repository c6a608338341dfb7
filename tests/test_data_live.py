"""The data tools on the real live system: `xirang up` (embedded NATS, the scheduler, a
simulated host running real processes), a preemption, then the projection and the audit
read what the scheduler wrote."""

from __future__ import annotations

import json
import time

import duckdb
import pytest

from live_helpers import xirang_up
from data_helpers import xirang

pytestmark = pytest.mark.timeout(120)


def _projected(url: str, db: str, sql: str) -> list[tuple]:
    assert xirang("project", "--nats", url, "--db", db).returncode == 0
    con = duckdb.connect(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _committed_sagas(url: str, db: str) -> list[tuple]:
    return _projected(url, db, "SELECT saga, preemptor, benefit, cost FROM sagas WHERE outcome = 'committed'")


def _wait_until_running(url: str, db: str, jobs: list[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    sql = f"SELECT job FROM jobs WHERE state = 'running' AND job IN ({', '.join(repr(j) for j in jobs)})"
    while len(_projected(url, db, sql)) < len(jobs):
        assert time.monotonic() < deadline, f"{jobs} did not all start within {timeout_s} s"
        time.sleep(0.5)


def _submit(url: str, job: str, *, team: str, level: int, gpus: int) -> None:
    """A job of A100 GPUs that sleeps a minute, and check it is accepted."""
    done = xirang(
        "submit",
        job,
        "--team",
        team,
        "--level",
        str(level),
        "--gpus",
        str(gpus),
        "--gpu-model",
        "A100",
        "--command",
        "sleep 60",
        "--nats",
        url,
    )
    assert done.stdout.startswith("accepted"), done.stdout + done.stderr


def test_projection_and_audit_read_what_the_live_scheduler_wrote(tmp_path):
    data = str(tmp_path / "xr")
    with xirang_up(data, hosts=1, simulate="8xA100") as info:
        url = info["nats"]
        for job in ("low-1", "low-2"):
            _submit(url, job, team="batch", level=6, gpus=4)
        db = str(tmp_path / "p.duckdb")
        _wait_until_running(url, db, ["low-1", "low-2"])  # so that the urgent job has to preempt
        _submit(url, "urgent", team="safety", level=1, gpus=8)
        deadline = time.monotonic() + 60
        while not _committed_sagas(url, db) and time.monotonic() < deadline:
            time.sleep(0.5)
        sagas = _committed_sagas(url, db)
        audit = xirang(
            "audit", "--nats", url, "--job", "low-1", "--json", "--public-key", f"{data}/keys/scheduler.pub"
        )
    assert [s[1] for s in sagas] == ["urgent"] and sagas[0][2] > sagas[0][3]
    summary = json.loads(audit.stdout)
    assert audit.returncode == 0 and summary["ok"], summary
    story = "\n".join(summary["story"])
    assert "preempted by urgent (level 1, team safety" in story and "released its GPUs" in story
