"""Helpers for the live tests that the product does not need: `xirang up` as a process, a
job that never reaches a safe point, and the metrics lines a job printed. The cluster
itself is agents/local_cluster.py (the live bench and chaos use it too)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agents.local_cluster import REPO
from agents.runfolders import run_folders


@contextlib.contextmanager
def xirang_up(data_dir: str, hosts: int, simulate: str, tick_ms: int = 200):
    """`xirang up --json` as a real process: yields its first line (the NATS URL and the
    pids it started); stopped by its pid with SIGTERM, as Ctrl-C would, on the way out."""
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xirang.cli",
            "up",
            "--json",
            "--data-dir",
            data_dir,
            "--hosts",
            str(hosts),
            "--simulate",
            simulate,
            "--tick-ms",
            str(tick_ms),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        yield json.loads(up.stdout.readline())
    finally:
        os.kill(up.pid, signal.SIGTERM)
        up.wait(30)


STUCK_CODE = """\
import os, pathlib, signal, time
# Claims to use the SDK, then never reaches a safe point (a hung collective, say).
signal.signal(signal.SIGUSR1, lambda *a: None)
pathlib.Path(os.environ["XR_JOB_DIR"], "sdk").write_text("stuck")
time.sleep(120)
"""


def stuck_command() -> list[str]:
    return [sys.executable, "-c", STUCK_CODE]


def metrics(output_log: Path) -> list[dict]:
    out = []
    for line in output_log.read_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def run_folder(runs_dir: Path, job: str, n: int, timeout_s: float = 20.0) -> Path:
    """The folder of the run of `job` that record `n` started (its name ends in a secret the
    agent drew: agents/runfolders.py), once the agent has made it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = run_folders(Path(runs_dir), job, n)
        if found:
            return found[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no run folder for {job} record {n} in {runs_dir}")
        time.sleep(0.1)
