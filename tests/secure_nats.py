"""The shipped deploy/nats configs, started on loopback as the README says: users made by
`xirang nats init` and
`xirang nats add-user`, certificates by `xirang tls init`, the config files copied with
only their addresses and folders changed. Servers are real processes, stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from transport.natsd import free_port, nats_server_binary
from agents.local_cluster import REPO
from tests.data_helpers import xirang

USERS = [
    ["scheduler"],
    ["host", "h1"],
    ["client", "vision", "li"],
    ["client", "safety", "kim"],
    ["op", "alice"],
    ["reader", "auditor"],
]


class SecureNats:
    """`nodes` servers from deploy/nats (single.conf for one, cluster-N.conf for three)."""

    def __init__(self, root: Path, nodes: int = 1) -> None:
        self.root = Path(root)
        self.conf_dir = self.root / "nats"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port() for _ in range(nodes)]
        self.route_ports = [free_port() for _ in range(nodes)] if nodes > 1 else []
        self.procs: list[subprocess.Popen] = []
        done = xirang("nats", "init", "--dir", str(self.conf_dir))
        assert done.returncode == 0, done.stderr
        for user in USERS:
            done = xirang("nats", "add-user", *user, "--dir", str(self.conf_dir))
            assert done.returncode == 0, done.stderr
        servers = [f"--server=xirang-{i + 1}=127.0.0.1,localhost" for i in range(nodes)]
        done = xirang("tls", "init", "--dir", str(self.conf_dir / "tls"), *servers)
        assert done.returncode == 0, done.stderr
        self.ca = str(self.conf_dir / "tls" / "ca.pem")
        self.configs = [self._config(i, nodes) for i in range(nodes)]

    def _config(self, i: int, nodes: int) -> Path:
        name = "single.conf" if nodes == 1 else f"cluster-{i + 1}.conf"
        text = (REPO / "deploy" / "nats" / name).read_text()
        text = text.replace("0.0.0.0:4222", f"127.0.0.1:{self.ports[i]}")
        text = text.replace("/var/lib/xirang/nats", str(self.root / f"js-{i + 1}"))
        text = text.replace("/etc/xirang/nats", str(self.conf_dir))
        if nodes > 1:
            text = text.replace("0.0.0.0:6222", f"127.0.0.1:{self.route_ports[i]}")
            for j in range(nodes):
                text = text.replace(
                    f"nats-route://xirang-{j + 1}:6222", f"nats-route://localhost:{self.route_ports[j]}"
                )
        path = self.conf_dir / f"node-{i + 1}.conf"
        path.write_text(text)
        return path

    def start(self) -> "SecureNats":
        for i, conf in enumerate(self.configs):
            log = open(self.root / f"nats-{i + 1}.log", "ab")
            self.procs.append(
                subprocess.Popen(
                    [nats_server_binary(), "-c", str(conf)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
            log.close()
        for i, port in enumerate(self.ports):
            _wait_listening(port, self.procs[i], self.root / f"nats-{i + 1}.log")
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)

    @property
    def url(self) -> str:
        """The README's form: several servers, one URL, TLS."""
        return ",".join(f"tls://localhost:{port}" for port in self.ports)

    def creds(self, name: str) -> str:
        return str(self.conf_dir / "creds" / f"{name}.creds")

    def env(self, user: str) -> dict:
        return {
            **os.environ,
            "XIRANG_CREDS": self.creds(user),
            "XIRANG_TLS_CA": self.ca,
            "XIRANG_REPLICAS": str(len(self.ports)),
        }

    def log_text(self) -> str:
        return "".join(p.read_text() for p in sorted(self.root.glob("nats-*.log")))


@contextmanager
def running_cluster(tmp_path: Path, monkeypatch, nodes: int = 1, stop_wait_s: float = 15):
    """The shipped config (TLS, NKEY users) started on loopback, and a list the test adds its
    processes to: on the way out they are stopped (by pid), then their jobs, then NATS."""
    nats = SecureNats(tmp_path, nodes=nodes).start()
    monkeypatch.setenv("XIRANG_TLS_CA", nats.ca)
    procs: list[subprocess.Popen] = []
    try:
        yield nats, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(stop_wait_s)
        from agents.host import stop_job_processes

        stop_job_processes(tmp_path / "host")
        nats.stop()


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)


def spawn(root: Path, env: dict, *args: str) -> subprocess.Popen:
    out = open(root / f"{args[0]}-{len(list(root.glob(args[0] + '-*.log')))}.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "xirang.cli", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    )


def spawn_scheduler(nats: SecureNats, root: Path, *extra: str) -> subprocess.Popen:
    """A scheduler process with the scheduler's credentials, its data under `root`/sched,
    ticking every 200 ms (`extra` adds options)."""
    return spawn(
        root, nats.env("scheduler"), "scheduler", "--nats", nats.url, "--data-dir", str(root / "sched"),
        "--tick-ms", "200", *extra,
    )  # fmt: skip


def run_cli(env: dict, *args: str, timeout_s: float = 60) -> tuple[int, dict | str]:
    done = subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout_s,
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        return done.returncode, done.stdout + done.stderr
