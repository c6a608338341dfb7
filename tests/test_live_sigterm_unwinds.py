"""SIGTERM to a command that started processes of its own unwinds it: `xirang chaos` (like
`xirang demo`) stops the nats-server, schedulers, agents and jobs it started, `xirang sim`
its worker processes, `xirang bench replay` its nats-server and folder, before it exits
(143). SIGTERM's default ended it at once and left them running (a simulation worker for
minutes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agents.local_cluster import REPO

pytestmark = pytest.mark.timeout(120)


def processes_under(folder) -> list[int]:
    """Pids of the processes (other than this one) whose command line names `folder`."""
    needle = str(folder).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return found


def wait_until(predicate, timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def test_sigterm_to_chaos_stops_the_cluster_it_started(tmp_path):
    root = tmp_path / "cluster"
    chaos = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xirang.cli",
            "chaos",
            "--seed",
            "3",
            "--duration",
            "60",
            "--data-dir",
            str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        # nats-server, two schedulers and two agents (each names the cluster's folder)
        assert wait_until(lambda: len(processes_under(root)) >= 5, 60), processes_under(root)
        os.kill(chaos.pid, signal.SIGTERM)
        _, err = chaos.communicate(timeout=60)
        assert chaos.returncode == 143, err
        wait_until(lambda: not processes_under(root), 10)
        assert processes_under(root) == []
    finally:
        if chaos.poll() is None:
            chaos.kill()
            chaos.wait(10)
        for pid in processes_under(root):  # what the command left behind, if it failed to
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("processes_started", [2, 4], ids=["while-starting", "while-running"])
def test_sigterm_to_a_simulation_stops_its_worker_processes(tmp_path, processes_started):
    """Sent while the manager and the workers start (only the manager forked yet) or once
    all run: before, a SIGTERM in the start-up window met the default action, and the
    orphaned children kept simulating (and held the pipes open)."""
    out = tmp_path / "scorecard"
    sim = subprocess.Popen(
        [sys.executable, "-m", "xirang.cli", "sim", "--trace", "philly", "--limit", "20000"]
        + ["--gpus", "128", "--policies", "none,xirang", "--procs", "2", "--quiet", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        # the command, its queue's manager and two workers (forked: the same command line)
        started = wait_until(lambda: len(processes_under(out)) >= processes_started, 60, poll_s=0.005)
        assert started, processes_under(out)
        os.kill(sim.pid, signal.SIGTERM)
        _, err = sim.communicate(timeout=60)
        assert sim.returncode == 143, err
        wait_until(lambda: not processes_under(out), 10)
        assert processes_under(out) == []
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait(10)
        for pid in processes_under(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_sigterm_to_bench_replay_stops_its_nats_server_and_removes_its_folder(tmp_path):
    bench = subprocess.Popen(
        [sys.executable, "-m", "xirang.cli", "bench", "replay", "--json", "--quick"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # its temporary folder, so its nats-server's
    )
    try:
        # once its nats-server runs (the timed part), the bench is paused so the signal surely
        # arrives mid-measurement, then signalled and let go
        assert wait_until(lambda: len(processes_under(tmp_path)) >= 1, 60), "no nats-server seen"
        os.kill(bench.pid, signal.SIGSTOP)
        os.kill(bench.pid, signal.SIGTERM)
        os.kill(bench.pid, signal.SIGCONT)
        _, err = bench.communicate(timeout=60)
        assert bench.returncode == 143, err
        wait_until(lambda: not processes_under(tmp_path), 10)
        assert processes_under(tmp_path) == []
        assert list(tmp_path.glob("xirang-bench-replay-*")) == []
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)
        for pid in processes_under(tmp_path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
