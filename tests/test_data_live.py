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


def _committed_sagas(url: str, db: str) -> list[tuple]:
    assert xirang("project", "--nats", url, "--db", db).returncode == 0
    con = duckdb.connect(db, read_only=True)
    try:
        return con.execute(
            "SELECT saga, preemptor, benefit, cost FROM sagas WHERE outcome = 'committed'"
        ).fetchall()
    finally:
        con.close()


def test_projection_and_audit_read_what_the_live_scheduler_wrote(tmp_path):
    data = str(tmp_path / "xr")
    with xirang_up(data, hosts=1, simulate="8xA100") as info:
        url = info["nats"]
        for job in ("low-1", "low-2"):
            done = xirang(
                "submit",
                job,
                "--team",
                "batch",
                "--level",
                "6",
                "--gpus",
                "4",
                "--gpu-model",
                "A100",
                "--command",
                "sleep 60",
                "--nats",
                url,
            )
            assert done.stdout.startswith("accepted"), done.stdout + done.stderr
        time.sleep(1.0)  # let them start, so that the urgent job has to preempt
        done = xirang(
            "submit",
            "urgent",
            "--team",
            "safety",
            "--level",
            "1",
            "--gpus",
            "8",
            "--gpu-model",
            "A100",
            "--command",
            "sleep 60",
            "--nats",
            url,
        )
        assert done.stdout.startswith("accepted"), done.stdout + done.stderr
        db = str(tmp_path / "p.duckdb")
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
