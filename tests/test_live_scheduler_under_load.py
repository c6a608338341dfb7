"""The scheduler keeps its lead under what a frontier-scale pool throws at it: a snapshot
the object store will not take, and a flood of heartbeats from many hosts. A real
nats-server and the scheduler as its own OS process (agents/local_cluster.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agents.local_cluster import Cluster, matching
from core import types as T
from transport import bus

pytestmark = pytest.mark.timeout(120)

# Many hosts beating as fast as one process can publish (a real host beats once a second):
# far more than a scheduler's loop could read, and far more than its listener can.
FLOOD = """
import asyncio, json, sys, time
from transport import bus

async def flood(url, hosts, seconds):
    nc, _ = await bus.connect(url, reconnects=-1)
    bodies = [(f"{bus.HB_PREFIX}.flood-{i:05d}", json.dumps(
        {"healthy": True, "problem": "", "node": f"flood-{i:05d}", "gpu_model": "A100", "gpus": 8,
         "jobs": [], "t": 0, "instance": "flood", "pid": 0, "host": "flood"}).encode()) for i in range(hosts)]
    print("flooding", flush=True)
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        for subject, body in bodies[:500]:
            await nc.publish(subject, body)
        bodies = bodies[500:] + bodies[:500]
        sent += 500
        if sent % 20000 == 0:
            await nc.flush()
    await nc.close()

asyncio.run(flood(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""


def _scheduler_starts(records) -> int:
    return len(matching(records, T.SchedulerStarted))


async def _snapshot_store_room(nc, js, max_bytes: int) -> None:
    """Give the snapshot bucket's stream room for `max_bytes` (-1: no limit); it refuses
    what would not fit (an object store discards nothing old)."""
    info = await js.stream_info(f"OBJ_{bus.SNAP_BUCKET}")
    info.config.max_bytes = max_bytes
    await js.update_stream(info.config)


def test_a_snapshot_the_store_refuses_costs_no_lead_and_is_put_once_the_store_is_back(tmp_path):
    with Cluster(tmp_path, tick_ms=200, lease_ms=1000) as c:
        c.scheduler("s1", "--snapshot-every-events", "20")
        c.wait_for(T.SchedulerStarted)

        c._run(
            lambda nc, js: _snapshot_store_room(nc, js, 256)
        )  # every snapshot put fails for real from now on
        log_path = c.logs / "s1.log"
        for i in range(30):
            c.send(T.NodeUp(node=f"h{i}", gpu_model="A100", gpus=8))
        c.wait_for(T.NodeJoined, count=30)
        deadline = time.monotonic() + 20
        while not any(said in log_path.read_text() for said in ("putting the snapshot of", "leading failed")):
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        for i in range(30, 60):  # more snapshots come due (and fail) while inputs keep coming
            c.send(T.NodeUp(node=f"h{i}", gpu_model="A100", gpus=8))
        records = c.wait_for(T.NodeJoined, count=60)
        assert _scheduler_starts(records) == 1, log_path.read_text()[-3000:]
        text = log_path.read_text()
        assert "leading failed" not in text and "re-reading the log" not in text, text[-3000:]
        assert "still leading, trying again" in text

        async def restore_and_read(nc, js):
            await _snapshot_store_room(nc, js, -1)  # the store has room again
            deadline = time.monotonic() + 40
            while True:
                state, covered = await bus.load_snapshot_obj(js)
                if state is not None:
                    return state, covered
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                await asyncio.sleep(0.3)

        state, covered = c._run(restore_and_read)
        assert len(state.canonical.nodes) == 60 and covered > 0  # tried again, and put
        assert _scheduler_starts(c.records()) == 1


def _lease_renewals(url: str, stop: threading.Event, seen: list[dict]) -> None:
    """Every write of the lease as the server took it (a plain subscription on the key's
    subject: the KV's own history keeps only the newest)."""

    async def go() -> None:
        nc, _ = await bus.connect(url, reconnects=-1)

        async def on_write(msg) -> None:
            if msg.data:
                seen.append(json.loads(msg.data))

        await nc.subscribe(f"$KV.{bus.LEASE_BUCKET}.scheduler", cb=on_write)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    asyncio.run(go())


def _beat(url: str, node: str, stop: threading.Event) -> None:
    async def go() -> None:
        nc, _ = await bus.connect(url, reconnects=-1)
        while not stop.is_set():
            await nc.publish(f"{bus.HB_PREFIX}.{node}", json.dumps({"node": node, "healthy": True}).encode())
            await asyncio.sleep(0.3)
        await nc.close()

    asyncio.run(go())


def test_a_flood_of_heartbeats_from_many_hosts_neither_lapses_the_lease_nor_costs_a_host_its_node(tmp_path):
    lease_ms = 2000
    with Cluster(tmp_path, tick_ms=200, lease_ms=lease_ms, node_timeout_ms=3000) as c:
        c.scheduler("s1")
        c.wait_for(T.SchedulerStarted)
        c.send(T.NodeUp(node="good", gpu_model="A100", gpus=8))
        c.wait_for(T.NodeJoined, node="good")
        stop, beating = threading.Event(), threading.Event()
        renewals: list[dict] = []
        watchers = [
            threading.Thread(target=_lease_renewals, args=(c.url, stop, renewals), daemon=True),
            threading.Thread(target=_beat, args=(c.url, "good", beating), daemon=True),
        ]
        for thread in watchers:
            thread.start()
        flood_s = 8.0
        flooder = subprocess.Popen(
            [sys.executable, "-c", FLOOD, c.url, "5000", str(flood_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        try:
            assert flooder.stdout.readline().strip() == b"flooding"
            began = time.monotonic()
            time.sleep(flood_s / 2)
            # An input in the middle of the flood is decided and logged at once.
            sent = time.monotonic()
            c.send(T.NodeUp(node="late", gpu_model="A100", gpus=8))
            c.wait_for(T.NodeJoined, node="late", timeout_s=30)
            input_s = time.monotonic() - sent
            flooder.wait(timeout=flood_s + 30)
            flood_took_s = time.monotonic() - began
        finally:
            if flooder.poll() is None:
                os.kill(flooder.pid, signal.SIGKILL)
                flooder.wait()
        time.sleep(1.0)
        # The good host beat all through the flood: its node was never lost.
        assert not matching(c.records(), T.NodeLost, node="good")
        beating.set()  # it goes silent: found out after the flood as before
        records = c.wait_for(T.NodeLost, node="good", timeout_s=30)
        stop.set()
        for thread in watchers:
            thread.join(10)
        log_text = (c.logs / "s1.log").read_text()
        assert _scheduler_starts(records) == 1, log_text[-3000:]
        assert "leading failed" not in log_text and "re-reading the log" not in log_text, log_text[-3000:]
        assert input_s < 5.0, (input_s, log_text[-3000:])
        # Each renewal was written before the one it renewed ran out.
        ours = [r for r in renewals if r.get("holder") == "s1"]
        assert len(ours) >= (flood_took_s * 1000 / lease_ms) * 2, (len(ours), flood_took_s)
        late_ms = [(b["until_ms"] - lease_ms) - a["until_ms"] for a, b in zip(ours, ours[1:])]
        print(f"input logged in {input_s:.2f} s; {len(ours)} renewals; latest {max(late_ms)} ms past expiry")
        assert max(late_ms) < 0, (max(late_ms), log_text[-3000:])


def _listener_pid(scheduler_pid: int, timeout_s: float = 20.0) -> int:
    """The scheduler's heartbeat listener process (its child running agents.heartbeats)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for task in os.listdir(f"/proc/{scheduler_pid}/task"):
            for pid in open(f"/proc/{scheduler_pid}/task/{task}/children").read().split():
                if b"agents.heartbeats" in open(f"/proc/{pid}/cmdline", "rb").read():
                    return int(pid)
        assert time.monotonic() < deadline, "no heartbeat listener under the scheduler"
        time.sleep(0.1)


def test_a_killed_heartbeat_listener_is_started_again_and_costs_no_host_its_node(tmp_path):
    with Cluster(tmp_path, tick_ms=200, node_timeout_ms=2000) as c:
        sched = c.scheduler("s1")
        agent = c.agent("h1", "2xH100")
        c.wait_for(T.NodeJoined, node="h1")
        first = _listener_pid(sched.pid)
        os.kill(first, signal.SIGKILL)
        time.sleep(4.0)  # two node timeouts without the listener it had
        second = _listener_pid(sched.pid)
        assert second != first
        assert not matching(c.records(), T.NodeLost, node="h1")
        assert "the heartbeat listener ended" in (c.logs / "s1.log").read_text()
        c.kill(agent)  # the new listener hears the silence as the first would have
        records = c.wait_for(T.NodeLost, node="h1", timeout_s=20)
        assert _scheduler_starts(records) == 1
