"""`xirang up`: one command brings up embedded NATS, the scheduler and simulated hosts;
clients find it through the data folder; Ctrl-C (SIGTERM) stops every process it started."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from agents.host import pid_alive
from agents.local_cluster import REPO
from live_helpers import xirang_up

pytestmark = pytest.mark.timeout(120)


def test_up_runs_a_cluster_that_clients_find_and_stops_it_all(tmp_path):
    data = str(tmp_path / "xr")
    with xirang_up(data, hosts=2, simulate="8xH100,4xA100") as info:
        pids = list(info["pids"].values()) + [info["nats_pid"]]
        assert len(pids) == 4 and all(pid_alive(p) for p in pids)
        cli = [sys.executable, "-m", "xirang.cli"]
        deadline = time.monotonic() + 20
        while _total_gpus(data) < 12 and time.monotonic() < deadline:  # the hosts join
            time.sleep(0.3)
        assert _total_gpus(data) == 12
        done = subprocess.run(
            cli
            + [
                "submit",
                "big",
                "--team",
                "a",
                "--level",
                "2",
                "--gpus",
                "4",
                "--gpu-model",
                "A100",
                "--data-dir",
                data,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert done.stdout.startswith("accepted"), done.stdout + done.stderr
    assert all(not pid_alive(p) for p in pids)


def _total_gpus(data: str) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "xirang.cli", "queue", "--data-dir", data],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    ).stdout
    if not out.strip():
        return 0  # the scheduler has not created the streams yet
    last = out.strip().splitlines()[-1]  # "GPUs free F/T; sagas open S"
    return int(last.split("/")[1].split(";")[0])
