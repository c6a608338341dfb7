"""One instance per place: a second `xirang up` in a folder in use, a second agent for
one node, and a second embedded NATS on one store refuse to start, naming the holder, and
change nothing; an embedded NATS whose picked port was taken meanwhile picks another."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from agents.host import pid_alive
from agents.local_cluster import REPO, Cluster
from live_helpers import xirang_up
from core import types as T
from transport.locks import AlreadyRunning
from transport.natsd import EmbeddedNats, PortTaken

pytestmark = pytest.mark.timeout(120)


def xirang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_a_second_xirang_up_in_a_folder_in_use_refuses_and_changes_nothing(tmp_path):
    data = tmp_path / "xr"
    with xirang_up(str(data), hosts=1, simulate="8xH100") as info:
        deadline = time.monotonic() + 30  # the scheduler and the host have made their folders
        while not ((data / "keys").exists() and (data / "hosts").exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        url_before = (data / "nats.url").read_text()
        files_before = sorted(p.name for p in data.iterdir())
        second = xirang("up", "--data-dir", str(data), "--hosts", "1", "--simulate", "8xH100")
        assert second.returncode != 0
        assert "already running" in (second.stdout + second.stderr)
        assert f"pid {_up_pid(data)}" in second.stderr  # names the holder
        assert (data / "nats.url").read_text() == url_before
        assert sorted(p.name for p in data.iterdir()) == files_before
        assert all(pid_alive(p) for p in info["pids"].values())


def _up_pid(data) -> int:
    import json

    return json.loads((data / "up.lock").read_text())["pid"]


def test_a_second_agent_for_one_node_refuses_to_start(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler("s1")
        first = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        second = xirang(
            "agent", "--nats", c.url, "--node", "h1", "--simulate", "8xH100", "--data-dir", str(tmp_path)
        )
        assert second.returncode != 0 and "an agent for node h1 is already running" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert first.poll() is None


def test_a_second_nats_server_on_one_store_refuses(tmp_path):
    with EmbeddedNats(tmp_path / "nats"):
        with pytest.raises(AlreadyRunning, match="already running"):
            EmbeddedNats(tmp_path / "nats").start()
    with EmbeddedNats(tmp_path / "nats"):  # free again once the first stopped
        pass


def test_a_nats_server_whose_picked_port_was_taken_meanwhile_moves_to_another(tmp_path):
    # Tests run in parallel: a free port may be taken between picking it and binding it.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        nats = EmbeddedNats(tmp_path / "picked")
        nats.port = taken  # as if another process took the port it picked
        with nats:
            assert nats.port != taken and nats.proc.poll() is None
        with pytest.raises(PortTaken, match=f"port {taken} is taken"):  # a port asked for stays
            EmbeddedNats(tmp_path / "asked", port=taken).start()


def test_a_second_agent_for_one_node_from_another_folder_refuses_when_the_first_answers(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler("s1")
        first = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        second = xirang(
            "agent",
            "--nats",
            c.url,
            "--node",
            "h1",
            "--simulate",
            "8xH100",
            "--data-dir",
            str(tmp_path / "elsewhere"),
        )
        assert second.returncode != 0 and f"pid {first.pid}" in second.stderr, second.stderr
        assert first.poll() is None


def test_a_second_scheduler_with_the_same_id_and_folder_refuses(tmp_path):
    with Cluster(tmp_path) as c:
        first = c.scheduler("s1")
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        second = xirang("scheduler", "--nats", c.url, "--id", "s1", "--data-dir", str(tmp_path))
        assert second.returncode != 0 and f"pid {first.pid}" in second.stderr, second.stderr
        assert first.poll() is None
