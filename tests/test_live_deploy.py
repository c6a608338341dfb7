"""The shipped NATS configuration works as written: a server started from
deploy/nats/single.conf runs the whole system under its accounts, and its subject
permissions keep everyone but the scheduler off the log."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from transport import bus
from transport.natsd import free_port, nats_server_binary
from agents.testing import REPO, sleep_command
from core import types as T

pytestmark = pytest.mark.timeout(120)
PASSWORDS = {"XR_SCHEDULER_PASSWORD": "s-pw", "XR_HOST_PASSWORD": "h-pw", "XR_JOB_PASSWORD": "j-pw",
             "XR_CLIENT_PASSWORD": "c-pw", "XR_ADMIN_PASSWORD": "a-pw"}


@pytest.fixture
def server(tmp_path):
    port = free_port()
    conf = (REPO / "deploy" / "nats" / "single.conf").read_text()
    conf = conf.replace("0.0.0.0:4222", f"127.0.0.1:{port}").replace("/var/lib/xirang/nats", str(tmp_path / "js"))
    (tmp_path / "single.conf").write_text(conf)
    (tmp_path / "accounts.conf").write_text((REPO / "deploy" / "nats" / "accounts.conf").read_text())
    log = open(tmp_path / "nats.log", "wb")
    proc = subprocess.Popen([nats_server_binary(), "-c", str(tmp_path / "single.conf")], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, **PASSWORDS})
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "nats.log").read_text()
            time.sleep(0.05)
    yield port
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(10)


def url(port: int, user: str) -> str:
    return f"nats://{user}:{PASSWORDS[f'XR_{user.upper()}_PASSWORD']}@127.0.0.1:{port}"


def spawn(tmp_path: Path, *args: str) -> subprocess.Popen:
    out = open(tmp_path / f"{args[0]}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "xirang.cli", *args, "--data-dir", str(tmp_path)],
                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def test_the_system_runs_under_the_shipped_accounts_and_only_the_scheduler_writes_the_log(server, tmp_path):
    procs = [spawn(tmp_path, "scheduler", "--nats", url(server, "scheduler"), "--tick-ms", "200"),
             spawn(tmp_path, "agent", "--nats", url(server, "host"), "--node", "h1", "--simulate", "4xL40S")]
    try:
        async def go():
            nc, js = await bus.connect(url(server, "client"))
            await bus.ensure_streams(js)
            await bus.wait_for(lambda: _has(js, T.NodeJoined), 20)
            await bus.send_input(js, T.Submit(job="j", team="a", user="u", level=3, gpus=2,
                                              command=sleep_command(0.3)))
            await bus.wait_for(lambda: _has(js, T.JobFinished), 20)
            before = await bus.stream_last_seq(js, bus.EV_STREAM)
            for user in ("host", "job", "client"):
                intruder = await nats.connect(url(server, user), error_cb=_ignore)
                await intruder.publish("xr.ev.log.JobFinished", b"{}")
                await intruder.flush()
                await intruder.close()
            await asyncio.sleep(0.3)
            after = await bus.stream_last_seq(js, bus.EV_STREAM)
            await nc.close()
            return before, after
        before, after = asyncio.run(go())
        assert before == after  # nobody else appended
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(10)


async def _ignore(_err):
    return None


async def _has(js, kind) -> bool:
    return any(isinstance(r.event, kind) for _, r in await bus.all_records(js))
