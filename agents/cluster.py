"""Cluster supervision: the scheduler and simulated host agents started as OS processes
(`xirang up`, the demo), their output in log files, and stopped by pid (SIGTERM, then
SIGKILL after a timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .jobuser import JOB_UID_RANGE_ENV, JOB_USER_ENV, own_user_name


def stop_children(children: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Stop the processes this process started: SIGTERM each, SIGKILL any still there after `timeout_s`."""
    for proc in children:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in children:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def stop_cluster(children: list[tuple[str, subprocess.Popen]], agents_timeout_s: float = 30.0) -> None:
    """An orderly stop: the host agents first (each checkpoints its SDK jobs and tells the
    scheduler, which requeues them), then the scheduler."""
    stop_children([proc for name, proc in children if name != "scheduler"], timeout_s=agents_timeout_s)
    stop_children([proc for name, proc in children if name == "scheduler"])


def start_cluster(
    url: str,
    data_dir,
    hosts: int,
    specs: list[str],
    policy: str | None = None,
    tick_ms: int = 1000,
    log_dir: Path | None = None,
    node_names: list[str] | None = None,
    extra_sched: list[str] | None = None,
    extra_agent: list[str] | None = None,
) -> list[tuple[str, subprocess.Popen]]:
    """Start the scheduler and simulated hosts as OS processes; their output goes to files."""
    log_dir = Path(log_dir or Path(data_dir) / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "xirang.cli"]
    children = []
    cmd = base + ["scheduler", "--nats", url, "--data-dir", str(data_dir), "--tick-ms", str(tick_ms)]
    if policy:
        cmd += ["--policy", policy]
    children.append(("scheduler", _spawn(cmd + (extra_sched or []), log_dir / "scheduler.log")))
    for i in range(hosts):
        spec = specs[i % len(specs)]
        name = node_names[i] if node_names else f"host-{i + 1}"
        cmd = base + [
            "agent",
            "--nats",
            url,
            "--data-dir",
            str(data_dir),
            "--node",
            name,
            "--simulate",
            spec,
            "--grace-s",
            "5",
            *(extra_agent or []),
        ]
        children.append((name, _spawn(cmd, log_dir / f"{name}.log")))
    return children


def local_agent_env() -> dict[str, str]:
    """The environment of a local cluster's processes (`xirang up`, the demo, the benchmarks,
    chaos): its simulated hosts run their (example) jobs as the user who started it, whatever
    that user is - root in a container too, where the unprivileged default may have no uid
    mapped and the cluster's folders are not reachable by other users - unless
    $XIRANG_JOB_USER names one or $XIRANG_JOB_UID_RANGE asks for one uid per run."""
    env = dict(os.environ)
    if not env.get(JOB_UID_RANGE_ENV):
        env[JOB_USER_ENV] = env.get(JOB_USER_ENV) or own_user_name()
    return env


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
    out = open(log_path, "ab")
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=local_agent_env()
    )
    out.close()
    return proc
