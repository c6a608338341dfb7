"""Runs are fenced: a host stopped past the node timeout loses its job to another host;
when it resumes it stops its old run, and only the new run's facts count (a fact of the
old run is refused as `stale_run`)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from agents.host import pid_alive
from agents.local_cluster import Cluster, matching
from core import types as T

pytestmark = pytest.mark.timeout(120)


def first_run_outlives_its_host_command(trace) -> list[str]:
    """Appends its pid to `trace`; the first run sleeps long enough to outlive however long a
    loaded machine takes to declare its stopped host down (the resumed host must stop it),
    a later run ends in seconds."""
    code = (
        "import os, time\n"
        f"first = not os.path.exists({str(trace)!r})\n"
        f"open({str(trace)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "time.sleep(100 if first else 2)\n"
    )
    return [sys.executable, "-c", code]


def test_a_host_back_after_being_declared_down_stops_its_old_run_and_only_the_new_run_counts(tmp_path):
    trace = tmp_path / "pids"
    with Cluster(tmp_path, node_timeout_ms=3000) as c:
        c.scheduler("s1")
        h1 = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.send(
            T.Submit(
                job="j",
                team="ml",
                user="ana",
                level=3,
                gpus=8,
                gpu_models=["H100"],
                est_runtime_s=30,
                command=first_run_outlives_its_host_command(trace),
            )
        )
        records = c.wait_for(T.JobRunning, job="j")
        first_run = matching(records, T.JobStartRequested, job="j")[0].n
        c.agent("h2", "8xH100")
        c.wait_for(T.NodeJoined, node="h2")
        old_pid = int(trace.read_text().split()[0])
        os.kill(h1.pid, signal.SIGSTOP)
        try:
            c.wait_for(T.NodeLost, node="h1", timeout_s=20)
            records = c.wait(
                lambda rs: len(matching(rs, T.JobStartRequested, job="j")) == 2,
                what="the job restarted elsewhere",
            )
            second = matching(records, T.JobStartRequested, job="j")[1]
            assert second.event.nodes == ["h2"]
            assert pid_alive(old_pid), "the old run lives on while its host is stopped"
            # The old run's exit, as a host would report it, no longer counts.
            c.send(T.Finished(job="j", ok=False, attempt=first_run))
            records = c.wait_for(T.InputRejected, reason="stale_run")
        finally:
            os.kill(h1.pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while pid_alive(old_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(old_pid), "the resumed host did not stop its old run"
        records = c.wait_for(T.JobFinished, job="j", timeout_s=30)
        assert not matching(records, T.JobFailed)
        assert [r.event.nodes for r in matching(records, T.JobFinished, job="j")] == [["h2"]]
        assert h1.poll() is None
